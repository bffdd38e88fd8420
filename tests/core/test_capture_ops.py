"""The capture engine records every torch-level op with its facts, edges, modules and costs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

import torchlens as tl
from tests.models.zoo import PURE_CASES


class Mixed(nn.Module):
    """Functional calls, tensor methods and operators, with a parameter used directly."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.w = nn.Parameter(torch.ones(3, 3))

    def forward(self, x):
        h = F.relu(self.fc(x))  # functional
        h = h.sum(dim=0, keepdim=True) + h  # method + operator
        return h @ self.w  # operator with a parameter


def test_records_functional_method_and_operator_calls():
    trace = tl.trace(Mixed(), torch.rand(2, 4))
    funcs = [op.func for op in trace if op.kind == "op"]
    assert funcs == ["linear", "relu", "sum", "add", "matmul"]
    assert [op.kind for op in trace][0] == "input" and trace[-1].kind == "output"


def test_per_op_facts():
    model = Mixed()
    trace = tl.trace(model, torch.rand(2, 4))
    linear = trace["linear_1"]
    assert linear.parents == ["input_1"] and linear.children == ["relu_1"]
    assert linear.shape == [2, 3] and linear.dtype == "float32" and linear.device == "cpu"
    assert linear.module == "fc" and linear.module_pass == 1 and linear.module_stack == ["fc:1"]
    assert linear.params == ["fc.weight", "fc.bias"]
    assert trace["matmul_1"].params == ["w"] and trace["matmul_1"].module == ""
    assert all(op.time_ns > 0 for op in trace if op.kind == "op")
    assert linear.nbytes == 2 * 3 * 4
    assert trace["add_1"].parents == ["sum_1", "relu_1"]


def test_flops_reuse_torch_formulas_and_unknown_is_none():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 5))
    x = torch.rand(2, 3, 8, 8)
    trace = tl.trace(model, x)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    assert trace["conv2d_1"].flops + trace["linear_1"].flops == counter.get_total_flops()
    assert trace["relu_1"].flops is None
    assert trace.total_flops == counter.get_total_flops()


def test_matmul_and_sdpa_flops_match_torch():
    q = torch.rand(2, 4, 5, 8)

    class MatMul(nn.Module):
        def forward(self, x):
            return x @ x.transpose(-1, -2)

    class Attention(nn.Module):
        def forward(self, x):
            return F.scaled_dot_product_attention(x, x, x)

    trace = tl.trace(MatMul(), q)
    with FlopCounterMode(display=False) as counter:
        MatMul()(q)
    assert trace.total_flops == counter.get_total_flops() > 0
    # On CPU torch's counter sees SDPA's math kernel, which it has no formula for; the trace
    # applies torch's own sdpa formula to the call's shapes.
    trace = tl.trace(Attention(), q)
    expected = flop_counter.sdpa_flop_count([2, 4, 5, 8], [2, 4, 5, 8], [2, 4, 5, 8])
    assert trace["scaled_dot_product_attention_1"].flops == expected > 0


def test_save_modes():
    model, x = PURE_CASES["cnn_bn"].build()
    everything = tl.trace(model, x)
    assert all(op.saved for op in everything)
    metadata = tl.trace(model, x, save=None)
    assert not any(op.saved for op in metadata)
    with pytest.raises(tl.TorchLensError) as err:
        _ = metadata["conv2d_1"].out
    assert err.value.code == "activation_not_saved"
    assert "tl.trace(model, x, save=['conv2d_1'])" in err.value.teach
    picked = tl.trace(model, x, save=["conv2d_1", "fc"])
    saved = {op.label for op in picked if op.saved}
    assert saved == {"conv2d_1", "linear_1", "output_1"}
    assert torch.equal(picked["conv2d_1"].out, everything["conv2d_1"].out)
    assert torch.equal(picked["fc"].out, everything["linear_1"].out)


def test_bad_save_selection_refuses_typed():
    model, x = PURE_CASES["mlp"].build()
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, save=3)
    assert err.value.code == "save_selection_invalid"


def test_inplace_ops_and_views_route_edges():
    model, x = PURE_CASES["inplace"].build()
    trace = tl.trace(model, x)
    assert trace["relu__1"].inplace and trace["mul__1"].inplace
    assert not trace["linear_1"].inplace
    # v = x.view(-1); v.mul_(2); return x * 1: the read of x sees the in-place write via v.
    assert trace["view_1"].is_view
    assert trace["mul_1"].parents == ["mul__1"]
    # the activation before an in-place op keeps its pre-mutation value
    assert not torch.equal(trace["view_1"].out, trace["mul__1"].out)
    assert torch.equal(trace["mul__1"].out, trace["view_1"].out * 2)


def test_setitem_is_recorded_as_a_mutation():
    class M(nn.Module):
        def forward(self, x):
            y = x * 1
            y[:, 0] = 0.0
            return y + 1

    trace = tl.trace(M(), torch.rand(2, 3))
    setitem = trace["setitem_1"]
    assert setitem.inplace and setitem.parents == ["mul_1"]
    assert trace["add_1"].parents == ["setitem_1"]
    assert torch.all(trace["setitem_1"].out[:, 0] == 0)


def test_pass_qualified_labels_for_repeated_modules():
    model, x = PURE_CASES["recurrent"].build()
    trace = tl.trace(model, x)
    cell_ops = [op.label for op in trace if op.module == "cell"]
    assert cell_ops[:3] == ["linear_2", "linear_2:2", "linear_2:3"]
    assert trace["linear_2:1"] is trace["linear_2"]
    assert trace["linear_2:3"].pass_num == 3 and trace["linear_2:3"].base_label == "linear_2"
    cell = trace["cell"]
    assert [c.pass_num for c in cell.calls] == [1, 2, 3]
    assert trace["cell:2"].output_ops == ["linear_2:2"]


def test_branches_and_concat():
    model, x = PURE_CASES["branch_concat"].build()
    trace = tl.trace(model, x)
    cat = next(op for op in trace if op.func == "cat")
    assert len(cat.parents) == 2
    assert len(trace["input_1"].children) == 2


def test_nested_outputs_rebuilt():
    model, x = PURE_CASES["dict_output"].build()
    trace = tl.trace(model, x)
    with torch.no_grad():
        expected = model(x)
    out = trace.output
    assert set(out) == set(expected)
    assert isinstance(out["aux"], tuple) and torch.equal(out["aux"][1], expected["aux"][1])
    assert [op.slot for op in trace.outputs][0] == "['logits']"


@dataclasses.dataclass
class _Pair:
    y: torch.Tensor
    z: torch.Tensor
    n: int = 3


class _PairHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x):
        h = self.l(x)
        return _Pair(h.relu(), h.sigmoid())


class _ReturnsPairs(nn.Module):
    """A submodule and the model both return a plain dataclass of tensors."""

    def __init__(self):
        super().__init__()
        self.head, self.fc = _PairHead(), nn.Linear(4, 2)

    def forward(self, x):
        p = self.head(x)
        return _Pair(self.fc(p.y + p.z), p.z)


def test_dataclass_outputs_are_walked_like_mappings(tmp_path):
    model, x = _ReturnsPairs(), torch.randn(2, 4)
    trace = tl.trace(model, x)
    with torch.no_grad():
        expected, inner = model(x), model.head(x)
    assert [op.slot for op in trace.outputs] == [".y", ".z"]
    assert trace["output_2"].parents == ["sigmoid_1"]
    out = trace.output
    assert set(out) == {"y", "z", "n"} and out["n"] == 3
    assert torch.equal(out["y"], expected.y) and torch.equal(out["z"], expected.z)
    head = trace["head"].calls[0]
    assert head.output_ops == ["relu_1", "sigmoid_1"]
    assert torch.equal(head.out[1], expected.z)
    (kept,) = tl.record(model, [x], save=["head"])["head"]  # one input: one kept value
    assert torch.equal(kept[0], inner.y) and torch.equal(kept[1], expected.z)
    assert tl.validation.validate_backward_pass(model, x).passed
    trace.save(tmp_path / "t.tl")
    assert tl.load(tmp_path / "t.tl").output_structure == trace.output_structure


def test_a_dataclass_input_gets_input_nodes():
    class TakesPair(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, pair):
            return self.l(pair.y) + pair.z

    trace = tl.trace(TakesPair(), _Pair(torch.randn(2, 4), torch.randn(2, 4)))
    assert [op.label for op in trace.inputs] == ["input_1", "input_2"]
    assert trace["linear_1"].parents == ["input_1"]
    assert trace["add_1"].parents == ["linear_1", "input_2"]


def test_shared_parameters_counted_once():
    model, x = PURE_CASES["tied_params"].build()
    trace = tl.trace(model, x)
    unique = sum(p.numel() for p in model.parameters())
    assert trace.num_params == unique
    shared = [name for name, info in trace.params.items() if info["aliases"]]
    assert shared and len(trace.params[shared[0]]["used_by"]) == 2


def test_multiple_positional_and_keyword_inputs():
    model, (a, b) = PURE_CASES["multi_positional"].build()
    trace = tl.trace(model, (a, b))
    assert [op.slot for op in trace.inputs] == ["0", "1"]
    model, kw = PURE_CASES["keyword_inputs"].build()
    trace = tl.trace(model, kw)
    assert [op.slot for op in trace.inputs] == list(kw)


def test_import_changes_nothing_in_torch():
    code = (
        "import torch, torch.nn.functional as F\n"
        "before = (F.relu, torch.add, torch.Tensor.__add__, torch.nn.Module.__call__)\n"
        "import torchlens\n"
        "after = (F.relu, torch.add, torch.Tensor.__add__, torch.nn.Module.__call__)\n"
        "from torch.nn.modules import module as m\n"
        "assert before == after\n"
        "assert not torch._C._is_torch_function_mode_enabled()\n"
        "assert not m._global_forward_hooks and not m._global_forward_pre_hooks\n"
        "print('clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "clean", out.stderr


def test_trace_inside_traced_forward_refuses():
    class Inner(nn.Module):
        def forward(self, x):
            tl.trace(nn.Identity(), x)
            return x

    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(Inner(), torch.rand(2))
    assert err.value.code == "nested_trace"


def test_addmm_and_baddbmm_flops_match_torch():
    class Conv1DLike(nn.Module):  # Hugging Face GPT-2's Conv1D: addmm(bias, x, weight)
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.rand(8, 12))
            self.bias = nn.Parameter(torch.rand(12))

        def forward(self, x):
            y = torch.addmm(self.bias, x.view(-1, 8), self.weight)
            return torch.baddbmm(torch.zeros(2, 3, 3), y.view(2, 3, 12), y.view(2, 12, 3))

    model, x = Conv1DLike(), torch.rand(6, 8)
    trace = tl.trace(model, x)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(x)
    assert trace["addmm_1"].flops and trace["baddbmm_1"].flops
    assert trace.total_flops == counter.get_total_flops()


def test_flops_from_a_weight_parameter_equal_those_from_the_call_shapes():
    """A linear or addmm whose weight is a parameter keeps only the parameter's name per call;
    its count equals the one made from the call's shapes (the same weight as a plain tensor)
    and torch's."""

    class Calls(nn.Module):
        def __init__(self, as_parameter: bool):
            super().__init__()
            make = nn.Parameter if as_parameter else (lambda t: t)
            gen = torch.Generator().manual_seed(0)
            self.w = make(torch.rand(5, 8, generator=gen))
            self.m = make(torch.rand(8, 5, generator=gen))
            self.b = make(torch.rand(5, generator=gen))

        def forward(self, x):
            y = F.linear(x, self.w, self.b)  # (2, 3, 8) -> (2, 3, 5)
            z = F.linear(x[0, 0], self.w)  # a 1-D input
            return y.sum() + z.sum() + torch.addmm(self.b, x.view(-1, 8), self.m).sum()

    x = torch.rand(2, 3, 8)
    with_params, with_tensors = tl.trace(Calls(True), x), tl.trace(Calls(False), x)
    assert with_params.params and not with_tensors.params
    counted = [(op.label, op.flops) for op in with_params if op.flops is not None]
    assert [label for label, _ in counted] == ["linear_1", "linear_2", "addmm_1"]
    assert counted == [(op.label, op.flops) for op in with_tensors if op.flops is not None]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        Calls(True)(x)
    assert with_params.total_flops == counter.get_total_flops() > 0


def test_user_hooks_run_inside_their_module_and_are_kept():
    """A user's forward hook that patches a module's output: the patch is an op of that module
    and the module's output is the patched tensor; the user's hooks stay, TorchLens's go."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    pre_calls = []
    pre = model[2].register_forward_pre_hook(lambda m, args: pre_calls.append(1))
    post = model[0].register_forward_hook(lambda m, args, out: out * 2)
    x = torch.rand(3, 4)
    with torch.no_grad():
        plain = model(x)
    trace = tl.trace(model, x)
    assert torch.equal(trace.output, plain)
    assert trace["0"].calls[0].ops == ["linear_1", "mul_1"]
    assert trace["0"].calls[0].output_ops == ["mul_1"]
    assert trace["mul_1"].module == "0" and trace["relu_1"].parents == ["mul_1"]
    assert len(pre_calls) == 2
    assert list(model[0]._forward_hooks) == [post.id]
    assert list(model[2]._forward_pre_hooks) == [pre.id]
    from torch.nn.modules import module as torch_module

    assert not torch_module._global_forward_hooks
    assert not torch_module._global_forward_pre_hooks


def _as_found(module: nn.Module) -> bool:
    """No instance ``forward`` or call of the capture's left on ``module``."""
    return not {"forward", "_compiled_call_impl"} & set(vars(module))


def test_module_boundaries_leave_every_forward_as_it_was():
    """Frames open through the module's call during the capture only: afterwards (also after
    a forward that raised) no module has an instance ``forward`` or call it did not have, a
    module whose ``forward`` the user replaced keeps that very object, and its ops count as
    that module's."""
    import inspect

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    original = model[2].forward

    def patched(x):
        return original(x) * 3

    model[2].forward = patched
    seen = []

    def spy(m, args):
        seen.append(inspect.signature(model[0].forward))

    model.register_forward_pre_hook(spy)
    trace = tl.trace(model, torch.rand(3, 4))
    assert trace["2"].calls[0].ops == ["linear_2", "mul_1"]
    assert trace["mul_1"].module == "2"
    assert str(seen[0]) == str(inspect.signature(nn.Linear(4, 4).forward))
    assert model[2].__dict__["forward"] is patched
    assert all(_as_found(m) for m in (model[0], model[1]))
    assert "_compiled_call_impl" not in vars(model[2])
    with pytest.raises(RuntimeError):
        tl.trace(model, torch.rand(3, 5))
    assert model[2].__dict__["forward"] is patched
    assert all(_as_found(m) for m in (model[0], model[1]))
    assert "_compiled_call_impl" not in vars(model[2])


def test_a_module_copied_inside_the_forward_is_its_own_module_after_the_capture():
    """A forward that keeps a deep copy of a submodule (a frozen snapshot) copies it while the
    capture's frames are on it: the copy carries none of them, so afterwards it runs its own
    weights, not the original's, and its call inside the capture is no pass of the original."""
    import copy

    class Snapshots(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.frozen = None

        def forward(self, x):
            if self.frozen is None:
                self.frozen = copy.deepcopy(self.fc)
            return self.fc(x) + self.frozen(x)

    model = Snapshots()
    trace = tl.trace(model, torch.rand(2, 4))
    assert [c.ops for c in trace["fc"].calls] == [["linear_1"]]
    assert _as_found(model.frozen)
    with torch.no_grad():
        model.fc.weight.zero_()
        x = torch.rand(2, 4)
        assert not torch.equal(model.frozen(x), model.fc(x))


class Gate(nn.Module):
    """Holds each thread inside the forward until the test lets it go."""

    def __init__(self):
        super().__init__()
        self.entered = {"a": threading.Event(), "b": threading.Event()}
        self.release = {"a": threading.Event(), "b": threading.Event()}

    def forward(self, x):
        name = threading.current_thread().name
        if name in self.entered:
            self.entered[name].set()
            assert self.release[name].wait(30)
        return x * 1


def test_two_threads_capturing_one_model_leave_it_as_it_was():
    """Captures that overlap in two threads (the first to start finishes first) each see their
    own thread's module calls only, and put back every module's own forward and remove every
    hook, whichever order they end in."""
    from torch.nn.modules import module as torch_module

    gate = Gate()
    model = nn.Sequential(gate, nn.Linear(4, 4), nn.ReLU())
    results, errors = {}, []

    def run(name):
        try:
            results[name] = tl.trace(model, torch.rand(2, 4), save=None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = {name: threading.Thread(target=run, args=(name,), name=name) for name in "ab"}
    threads["a"].start()
    assert gate.entered["a"].wait(30)
    threads["b"].start()
    assert gate.entered["b"].wait(30)
    gate.release["a"].set()
    threads["a"].join(30)
    gate.release["b"].set()
    threads["b"].join(30)
    assert not errors and set(results) == {"a", "b"}
    for trace in results.values():  # each saw its own thread's calls only
        assert [op.func for op in trace] == ["input", "mul", "linear", "relu", "output"]
        assert [len(trace[a].calls) for a in ("0", "1", "2")] == [1, 1, 1]
    assert all(_as_found(m) for m in model.modules())
    assert not torch_module._global_forward_hooks and not torch_module._global_forward_pre_hooks
    with torch.no_grad():
        assert [op.func for op in tl.trace(model, torch.rand(2, 4))] == [
            "input", "mul", "linear", "relu", "output"]


def test_process_wide_user_hooks_keep_their_place_around_module_calls():
    """A user's process-wide forward hook that patches outputs runs inside the module's call,
    as a module's own hook does: its op belongs to the module and is the module's output."""
    from torch.nn.modules import module as torch_module

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def double(m, args, out):
        return out * 2 if isinstance(m, nn.Linear) else None

    handle = torch_module.register_module_forward_hook(double)
    try:
        trace = tl.trace(model, torch.rand(3, 4))
        assert list(torch_module._global_forward_hooks) == [handle.id]
    finally:
        handle.remove()
    assert trace["0"].calls[0].ops == ["linear_1", "mul_1"]
    assert trace["0"].calls[0].output_ops == ["mul_1"]
    assert trace["relu_1"].parents == ["mul_1"]


class FallsBack(nn.Module):
    """A forward that tries a submodule, catches its error and goes on without it."""

    def __init__(self):
        super().__init__()
        self.fast = Raises()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        try:
            x = self.fast(x)
        except RuntimeError:
            pass
        return self.fc(x + 1).relu()


class Raises(nn.Module):
    def forward(self, x):
        x * 2
        raise RuntimeError("no fast path here")


@pytest.mark.parametrize("hooks", ["none", "the module's own", "process-wide"])
def test_a_caught_error_in_a_submodule_ends_its_call(hooks):
    """A submodule call that raises, caught by its caller, is a call of its own ops with no
    output; the ops after it belong to the modules that run them, however frames are opened
    (the wrapped forward, a module with hooks of its own, process-wide user hooks)."""
    from torch.nn.modules import module as torch_module

    model = FallsBack()
    handle = None
    if hooks == "the module's own":
        handle = model.fast.register_forward_hook(lambda m, args, out: None)
    elif hooks == "process-wide":
        handle = torch_module.register_module_forward_hook(lambda m, args, out: None)
    try:
        trace = tl.trace(model, torch.rand(2, 4), save=None)
    finally:
        if handle is not None:
            handle.remove()
    assert [(op.label, op.module, op.module_stack) for op in trace.ops if op.kind == "op"] == [
        ("mul_1", "fast", ["fast:1"]), ("add_1", "", []), ("linear_1", "fc", ["fc:1"]),
        ("relu_1", "", [])]
    call = trace["fast"].calls[0]
    assert (len(trace["fast"].calls), call.ops, call.output_ops) == (1, ["mul_1"], [])
    assert [c.ops for c in trace["fc"].calls] == [["linear_1"]]
    assert not torch_module._global_forward_hooks
    assert not torch_module._global_forward_hooks_always_called
    assert all(_as_found(m) for m in model.modules())


class FallsBackTwice(FallsBack):
    """Tries the raising submodule twice, then runs its linear layer twice."""

    def forward(self, x):
        for _ in range(2):
            try:
                x = self.fast(x)
            except RuntimeError:
                pass
        return self.fc(self.fc(x) + 1)


def test_a_recording_labels_the_ops_after_a_caught_error_as_the_trace_does():
    """A light capture's frames (only op labels selected) end with a call that raises, so the
    later passes of the same modules get the trace's pass labels and values."""
    model = FallsBackTwice()
    x = torch.rand(2, 4)
    trace = tl.trace(model, x, save="all")
    assert [op.label for op in trace.ops if op.kind == "op"] == [
        "mul_1", "mul_1:2", "linear_1", "add_1", "linear_1:2"]
    wanted = ["mul_1:2", "linear_1:2", "add_1"]
    recording = tl.record(model, x, save=wanted, progress=False)
    assert sorted(recording.labels) == sorted(wanted)
    for label in wanted:
        assert torch.equal(recording[label], trace[label].out)
    assert all(_as_found(m) for m in model.modules())


class Recurrent(nn.Module):
    """An LSTM (one op, three outputs) and a module returning one piece of a split."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 3, batch_first=True)
        self.head = Head()

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(out) + h.sum() + c.sum()


class Head(nn.Module):
    def forward(self, x):
        first, _ = x.split([2, 3], dim=1)
        return first


def test_a_saved_module_keeps_every_output_of_a_multi_output_op(tmp_path):
    """``save=[module]`` keeps each output of the op that made the module's output, by position
    (the LSTM's output, h and c), exactly as ``save="all"`` does; a piece of a split the module
    did not return is None, and both survive a save and load."""
    model = Recurrent().eval()
    x = torch.randn(2, 5, 4)
    everything = tl.trace(model, x)
    picked = tl.trace(model, x, save=["lstm", "head"])
    out, h, c = picked["lstm"].calls[0].out  # the call's output tensors, flat
    # in grad mode, as tl.trace ran it (on some CPUs the LSTM kernels of the two modes differ
    # in the last bit)
    expected, (h_ref, c_ref) = (t.detach() if isinstance(t, torch.Tensor) else tuple(
        u.detach() for u in t) for t in model.lstm(x))
    assert torch.equal(out, expected) and torch.equal(h, h_ref) and torch.equal(c, c_ref)
    assert all(torch.equal(a, b) for a, b in zip(picked["lstm_1"].out, everything["lstm_1"].out))
    first, rest = picked["split_1"].out
    assert rest is None and torch.equal(first, everything["split_1"].out[0])
    assert torch.equal(picked["head"].calls[0].out, first)
    picked.save(tmp_path / "t.tl")
    loaded = tl.load(tmp_path / "t.tl")
    assert loaded["split_1"].out[1] is None
    assert torch.equal(loaded["lstm"].calls[0].out[2], c_ref)


def test_saving_a_module_adds_no_ops_of_its_own():
    """The copy kept of a saved module's output is not an op of the model."""
    model = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 2)).eval()
    x = torch.randn(1, 4)
    by_module = tl.trace(model, x, save=["0"])
    assert [op.label for op in by_module] == [op.label for op in tl.trace(model, x, save="all")]
    assert [op.func for op in by_module] == ["input", "linear", "relu", "linear", "output"]
    assert torch.equal(by_module["0"].out, torch.relu(model[0][0](x)))


def _scripted(module: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated
        return torch.jit.script(module)


def test_a_torchscript_model_is_refused_and_a_scripted_submodule_warned_about():
    """TorchScript runs its ops where no mode sees them: a scripted model would give a trace
    without ops, so every surface refuses it; a scripted submodule is named in a warning, and
    the pinned surfaces still restore and verify the model around it."""
    x = torch.randn(2, 4)
    scripted = _scripted(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))
    for surface in (tl.trace, tl.summary):  # tl.draw shares their entry check (and needs viz)
        with pytest.raises(tl.TorchLensError) as err:
            surface(scripted, x)
        assert err.value.code == "scripted_model" and "torch.jit.script" in err.value.teach[0]
    with pytest.raises(tl.TorchLensError, match="scripted_model"):
        tl.record(scripted, [x], save=["linear_1"], progress=False)

    class Partly(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.c = nn.Linear(4, 4), nn.Linear(4, 2)
            self.b = _scripted(nn.Sequential(nn.Linear(4, 4), nn.ReLU()))

        def forward(self, x):
            return self.c(self.b(self.a(x)) + 1)

    model = Partly()
    with pytest.warns(tl.TorchLensWarning, match="scripted_submodule") as caught:
        trace = tl.trace(model, x)
    assert "['b']" in str(caught[0].message) and caught[0].filename == __file__
    assert [op.func for op in trace if op.kind == "op"] == ["linear", "add", "linear"]
    with pytest.warns(tl.TorchLensWarning, match="scripted_submodule"):
        receipt = tl.summary(model, x).receipt
    assert receipt.verified


def test_a_compiled_model_is_traced_through_its_original_modules():
    """``torch.compile`` wraps the model in an OptimizedModule (its model at ``_orig_mod``):
    a capture (and ``tl.record``'s light one) runs the original modules eagerly, compiling
    nothing, and records their ops and values; the compiled model compiles on its own next
    call, its modules unwrapped."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = model(x)
        trace = tl.trace(compiled, x)
    assert [(op.func, op.module) for op in trace if op.kind == "op"] == [
        ("linear", "_orig_mod.0"), ("relu", "_orig_mod.1"), ("linear", "_orig_mod.2")]
    assert torch.equal(trace.output, expected)
    assert [c.output_ops for c in trace["_orig_mod.2"].calls] == [["linear_2"]]
    assert all(_as_found(m) for m in model.modules())
    recording = tl.record(compiled, x, save=["relu_1", "_orig_mod.2"], progress=False,
                          compile=False)  # (by default a compiled model records compiled)
    assert torch.equal(recording["relu_1"], trace["relu_1"].out)
    assert torch.equal(recording["_orig_mod.2"], expected)
    assert not counters["stats"]["unique_graphs"] and not counters["graph_break"]
    with torch.no_grad():
        assert torch.equal(compiled(x), expected)
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    torch._dynamo.reset()


def test_a_submodule_compiled_in_place_is_traced_and_keeps_its_compiled_call():
    """``module.compile()`` sets the call ``nn.Module.__call__`` makes instead of its own: a
    capture runs it eagerly inside the submodule's frame (the ops are the submodule's, each
    module call one pass), and the submodule keeps that compiled call afterwards."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    model[0].compile(backend=backend)
    compiled_call = vars(model[0])["_compiled_call_impl"]
    x = torch.randn(3, 4)
    with torch.no_grad():
        expected = model[2](model[1](model[0]._call_impl(x)))  # nothing compiled yet
        trace = tl.trace(model, x)
    assert [(op.func, op.module) for op in trace if op.kind == "op"] == [
        ("linear", "0"), ("relu", "1"), ("linear", "2")]
    assert [c.output_ops for c in trace["0"].calls] == [["linear_1"]]
    assert torch.equal(trace.output, expected)
    assert vars(model[0])["_compiled_call_impl"] is compiled_call
    assert not graphs  # (whether torch compiles nn.Linear's own call afterwards varies)
    with torch.no_grad():
        assert torch.equal(model(x), expected)
    torch._dynamo.reset()


def test_overlapping_captures_in_two_threads_leave_torch_compile_on():
    """The eager stance is process-wide: the first of two overlapping captures sets it, the last
    to end (not the first) puts it back, so compiled code compiles again after both."""
    from torch._dynamo.utils import counters

    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()

    class Gate(nn.Module):
        def __init__(self, entered, wait_for):
            super().__init__()
            self.entered, self.wait_for = entered, wait_for

        def forward(self, x):
            self.entered.set()
            assert self.wait_for.wait(10)
            return x + 1

    def second():
        first_in.wait(10)
        tl.trace(Gate(second_in, first_out), torch.ones(2))

    thread = threading.Thread(target=second)
    thread.start()
    tl.trace(Gate(first_in, second_in), torch.ones(2))  # ends while the second still runs
    first_out.set()
    thread.join(10)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(nn.Linear(4, 4), backend="eager")
    compiled(torch.randn(2, 4))
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()


def test_an_op_that_returns_a_parameter_itself_feeds_its_readers():
    """``w.float()`` on a float32 parameter returns ``w`` itself: the op is the producer of
    what its readers read (as when an in-place write came first), and the parameter stays
    named on them."""

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4))

        def forward(self, x):
            return x * (1.0 + self.w.float())

    trace = tl.trace(Norm(), torch.randn(4), save=None)
    assert trace["float_1"].children == ["add_1"]
    assert trace["add_1"].parents == ["float_1"] and trace["add_1"].params == ["w"]


def test_record_keeps_a_copy_of_each_output_of_a_multi_output_op():
    """A later in-place write into the storage of ``chunk``'s outputs (or a module's tuple
    output) does not change what ``tl.record`` kept, as it does not change the trace's."""

    class Chunks(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.RNN(4, 4, batch_first=True)

        def forward(self, x):
            h = x * 1
            a, b = h.chunk(2, dim=1)
            out, last = self.rnn(x)
            h.zero_()
            out.zero_()
            return a + b, last

    model, x = Chunks(), torch.randn(1, 4, 4)
    with torch.no_grad():
        trace = tl.trace(model, x)
        recording = tl.record(model, x, save=["chunk_1", "rnn"], progress=False)
    [chunks] = recording["chunk_1"]  # one input: its tuple
    assert all(torch.equal(a, b) for a, b in zip(chunks, trace["chunk_1"].out))
    assert chunks[0].abs().sum() > 0
    [rnn] = recording["rnn"]
    assert torch.equal(rnn[0], trace["rnn"].calls[0].out[0]) and rnn[0].abs().sum() > 0


@pytest.mark.parametrize("hooked", [False, True])
def test_a_direct_forward_call_is_not_a_module_call(hooked):
    """``self.forward(v)`` called from a module's own forward (a list dispatched item by item)
    makes no module call, as for torch's hooks: the module has one call, with or without hooks
    of its own (the wrapped ``forward`` and the hooks agree)."""

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            if isinstance(x, list):
                return [self.forward(v) for v in x]
            return torch.relu(self.fc(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = Encoder()

        def forward(self, xs):
            a, b = self.enc(xs)
            return a + b

    model, fired = Model(), []
    if hooked:
        model.enc.register_forward_pre_hook(lambda mod, args: fired.append(1))
    trace = tl.trace(model, ([torch.randn(2, 3), torch.randn(2, 3)],))
    [call] = trace["enc"].calls
    assert call.ops == ["linear_1", "relu_1", "linear_1:2", "relu_2"]
    assert call.output_ops == ["relu_1", "relu_2"]
    assert [c.pass_num for c in trace["enc.fc"].calls] == [1, 2]
    assert fired == ([1] if hooked else [])


def test_writes_through_data_reach_the_readers_and_keep_saved_values():
    """``.data`` has a version counter of its own: a write through it (``y.data.mul_``, a
    parameter's ``w.data[0] = v``) is what later readers of ``y`` / ``w`` read, and
    ``t.data = v`` is an op (``set_data``) that leaves the value saved before it unchanged."""

    class DataWrites(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(3))

        def forward(self, x):
            y = x * 2
            y.data.mul_(0)
            self.w.data[0] = 5.0
            h = x * 3
            h.data = torch.full((2, 3), 7.0)
            return y + (x @ self.w)[:, None] + h

    x = torch.randn(2, 3)
    trace = tl.trace(DataWrites(), x)
    assert trace["add_1"].parents == ["mul__1", "getitem_1"]
    assert trace["matmul_1"].parents == ["input_1", "setitem_1"]
    assert trace["matmul_1"].params == ["w"]
    assert trace["set_data_1"].parents == ["mul_2", "full_1"]
    assert trace["add_2"].parents == ["add_1", "set_data_1"]
    assert torch.equal(trace["mul_2"].out, x * 3)
    assert torch.equal(trace["set_data_1"].out, torch.full((2, 3), 7.0))


def test_a_deep_copy_in_the_forward_is_an_op():
    """``copy.deepcopy(t)`` returns a new tensor made from ``t``: an op between them."""
    import copy

    class Copies(nn.Module):
        def forward(self, x):
            return copy.deepcopy(x + 1) * 2

    x = torch.randn(3)
    trace = tl.trace(Copies(), x)
    assert [(op.label, op.parents) for op in trace] == [
        ("input_1", []), ("add_1", ["input_1"]), ("deepcopy_1", ["add_1"]),
        ("mul_1", ["deepcopy_1"]), ("output_1", ["mul_1"])]
    assert torch.equal(trace["deepcopy_1"].out, x + 1)
