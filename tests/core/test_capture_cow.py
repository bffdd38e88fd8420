"""Saved activations are kept by reference and copied only when they could change."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.errors import TorchLensWarning


class Writes(nn.Module):
    """Every kind of in-place write TorchLens sees, each onto a tensor saved earlier."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        a = self.fc(x)  # linear_1
        b = a.view(-1)  # view_1 shares a's storage
        a.relu_()  # a method ending in "_"
        b[0] = 5.0  # __setitem__ through the view
        c = torch.zeros(2, 4)  # zeros_1
        torch.add(a, 1, out=c)  # out=
        F.relu(c, inplace=True)  # an inplace= flag
        nn.init.constant_(tensor=c, val=3.0)  # the written tensor passed by keyword
        torch.ops.aten.mul_.Tensor(a, torch.full((), 2.0))  # a schema marks the write
        return a + c


def test_values_are_those_at_op_time_whatever_writes_follow():
    torch.manual_seed(0)
    model, x = Writes(), torch.rand(2, 4)
    with torch.no_grad():  # out= refuses autograd
        linear = model.fc(x)
        trace = tl.trace(model, x)
    assert torch.equal(trace["linear_1"].out, linear)
    assert torch.equal(trace["view_1"].out, linear.view(-1))
    relu = linear.relu()
    assert torch.equal(trace["relu__1"].out, relu)
    written = relu.clone()
    written.view(-1)[0] = 5.0
    assert torch.equal(trace["setitem_1"].out, written.view(-1))
    assert torch.equal(trace["zeros_1"].out, torch.zeros(2, 4))
    assert torch.equal(trace["add_1"].out, written + 1)
    assert torch.equal(trace["relu_1"].out, (written + 1).relu())
    assert torch.equal(trace["constant__1"].out, torch.full((2, 4), 3.0))
    assert torch.equal(trace["output_1"].out, written * 2 + 3)
    assert not trace.annotations["capture_advisories"]


GRAD_MODES = pytest.mark.parametrize("grad", [True, False], ids=["graph", "no_grad"])


@GRAD_MODES
def test_a_value_nothing_else_can_reach_is_kept_without_a_copy(grad):
    pointers = []

    class Records(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            pointers.append(h.data_ptr())
            return h.sum()

    with torch.set_grad_enabled(grad):
        trace = tl.trace(Records(), torch.rand(3, 4))
    assert trace["linear_1"].out.data_ptr() == pointers[0]


@GRAD_MODES
def test_an_output_only_the_trace_holds_is_kept_without_a_copy(grad):
    """The forward's output (a language model's logits, often the largest tensor of all) is
    kept by reference like a saved op's value; one the model still holds is copied."""
    pointers = []

    class Outputs(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.head = nn.Linear(4, 4), nn.Linear(4, 8)

        def forward(self, x):
            h = self.fc(x)
            logits = self.head(h)
            pointers.append(logits.data_ptr())
            self.kept = h * 2  # the model holds this output after the forward
            return {"logits": logits, "hidden": self.kept}

    model = Outputs()
    with torch.set_grad_enabled(grad):
        trace = tl.trace(model, torch.rand(3, 4), save=["linear_1"])
    assert trace["output_1"].out.data_ptr() == pointers[0]
    before = trace["output_2"].out.clone()
    with torch.no_grad():
        model.kept.add_(100)
    assert torch.equal(trace["output_2"].out, before)
    assert torch.equal(trace.output["hidden"], before)


@GRAD_MODES
def test_an_op_that_returns_its_input_as_it_is_costs_no_copy(grad):
    """Eval-mode dropout and a same-dtype ``to`` return the very tensor they got: saved under
    each op, it is still the trace's alone (kept without a copy); one the model keeps is
    copied."""
    pointers = []

    class AsIs(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)  # linear_1
            d = F.dropout(h, p=0.5, training=False)  # dropout_1: h itself
            e = d.to(torch.float32)  # to_1: h itself
            pointers.append(h.data_ptr())
            kept = torch.relu(e)  # relu_1
            self.cache = F.dropout(kept, training=False)  # dropout_2: relu_1's output, kept
            return e.sum() + kept.sum()

    model = AsIs()
    with torch.set_grad_enabled(grad):
        trace = tl.trace(model, torch.rand(3, 4))
    for label in ("linear_1", "dropout_1", "to_1"):
        assert trace[label].out.data_ptr() == pointers[0], label
    before = model.cache.detach().clone()
    with torch.no_grad():
        model.cache.add_(1)
    assert torch.equal(trace["relu_1"].out, before)
    assert torch.equal(trace["dropout_2"].out, before)


@GRAD_MODES
def test_values_others_can_reach_are_copied_at_the_end(grad):
    """The model's state, a view of a parameter, a view of the input and the output itself can
    all be written after the capture; the trace keeps what they were."""

    class Reachable(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4, 4))

        def forward(self, x):
            first = x[0]  # a view of the caller's input
            wt = self.w.t()  # a view of a parameter
            h = x @ wt
            self.cache = h * 2  # kept by the model after the forward
            return h + first

    model, x = Reachable(), torch.rand(3, 4)
    with torch.set_grad_enabled(grad):
        trace = tl.trace(model, x)
    before = {label: trace[label].out.clone() for label in ("getitem_1", "t_1", "mul_1", "add_1")}
    x.add_(100)
    with torch.no_grad():
        model.w.add_(100)
    model.cache.add_(100)
    for label, value in before.items():
        assert torch.equal(trace[label].out, value), label


@GRAD_MODES
def test_a_view_the_caller_kept_is_copied_and_so_is_its_base(grad):
    """A hook keeps a view of an intermediate: writing through it after the capture changes
    neither the saved view nor the saved base; views only the trace holds stay aliases."""
    kept = []

    class Views(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            big = self.fc(x) * 2  # mul_1, the base
            view = big[0]  # getitem_1, a view the caller keeps (the first time)
            if not kept:
                kept.append(view)
            part = big[1]  # getitem_2, a view only the trace keeps
            return part.sum() + big.sum()

    model = Views()
    with torch.set_grad_enabled(grad):
        trace = tl.trace(model, torch.rand(3, 4))
        other = tl.trace(model, torch.rand(3, 4))
    saved = {label: trace[label].out.clone() for label in ("mul_1", "getitem_1", "getitem_2")}
    with torch.no_grad():
        kept[0].fill_(100.0)
    for label, value in saved.items():
        assert torch.equal(trace[label].out, value), label
    # the second trace's views are the trace's alone: they alias their base
    view, base = other["getitem_2"].out, other["mul_1"].out
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def test_a_write_torchlens_cannot_see_drops_that_value_and_says_so():
    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            with torch._C.DisableTorchFunction():  # as a C++ extension would: unseen
                h.add_(1)
            return h * 2

    with pytest.warns(TorchLensWarning, match="^activation_overwritten"):
        trace = tl.trace(Hidden(), torch.rand(2, 4))
    assert trace["linear_1"].saved is False
    assert trace["mul_1"].saved is True
    advisory = trace.annotations["capture_advisories"][0]
    assert advisory == {"code": "activation_overwritten", "ops": ["linear_1"]}
    with pytest.raises(tl.TorchLensError) as err:
        _ = trace["linear_1"].out
    assert err.value.code == "activation_not_saved"


def test_a_selected_view_keeps_only_its_own_elements():
    """A view saved without its base does not pin the base's whole storage."""

    class Slices(nn.Module):
        def forward(self, x):
            big = x * 2
            return big[0].sum()

    x = torch.rand(1000, 4)
    trace = tl.trace(Slices(), x, save=["getitem_1"])
    value = trace["getitem_1"].out
    assert torch.equal(value, (x * 2)[0])
    assert value.untyped_storage().nbytes() == 4 * value.element_size()
    all_saved = tl.trace(Slices(), torch.rand(1000, 4))
    view, base = all_saved["getitem_1"].out, all_saved["mul_1"].out
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


class HandsOut(nn.Module):
    """Keeps an alias of a saved value that TorchLens cannot follow as a tensor: a view of
    another dtype (not a view to autograd), a numpy array, a storage, a DLPack import."""

    def __init__(self, how: str):
        super().__init__()
        self.fc, self.how = nn.Linear(4, 4), how

    def forward(self, x):
        h = self.fc(x).relu()
        if self.how == "view_dtype":
            self.alias = h.view(torch.int32)
        elif self.how == "numpy":
            self.alias = h.numpy()
        elif self.how == "array":
            self.alias = h.__array__()
        elif self.how == "storage":
            self.alias = h.untyped_storage()
        else:
            self.alias = torch.from_dlpack(h.__dlpack__())
        return h * 2


@pytest.mark.parametrize("how", ["view_dtype", "numpy", "array", "storage", "dlpack"])
def test_a_saved_value_handed_out_through_an_untracked_alias_is_copied(how):
    """Writing through the alias after the trace leaves the saved value as the op made it."""
    model, x = HandsOut(how), torch.randn(3, 4)
    with torch.no_grad():
        trace = tl.trace(model, x)
        made = model.fc(x).relu()
        alias = model.alias
        if how == "storage":
            torch.tensor([], dtype=torch.uint8).set_(alias).fill_(0)
        elif how in ("numpy", "array"):
            alias[...] = 0
        else:
            alias.zero_()
    assert made.abs().sum() > 0 and torch.equal(trace["relu_1"].out, made)


class _Tagged(torch.Tensor):
    """A tensor subclass: ops on it return it."""


def test_a_copied_value_of_a_tensor_subclass_keeps_its_class():
    """A value copied before an in-place write (``mul_1`` below) is the subclass, as a value
    kept by reference is."""

    class WritesItsOutput(nn.Module):
        def forward(self, x):
            h = x * 2
            h.add_(1)
            return h

    x = torch.randn(3).as_subclass(_Tagged)
    trace = tl.trace(WritesItsOutput(), x)
    assert type(trace["mul_1"].out) is _Tagged and type(trace["add__1"].out) is _Tagged
    assert torch.equal(trace["mul_1"].out, x * 2)
