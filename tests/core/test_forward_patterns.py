"""Patterns real forwards use: autocast regions, sparse and nested tensors, custom autograd
Functions, activation checkpointing, views written in place through other views and ops that
return their input, through trace, validation, summary and save/load."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
import torch.utils.checkpoint as checkpoint
from torch import nn

import torchlens as tl
from tests.launch import child_env
from torchlens.errors import TorchLensError
from torchlens.validation import validate_backward_pass, validate_forward_pass


class Autocast(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = self.a(x).relu()
        return self.b(h.float())


def test_ops_in_an_autocast_region_are_replayed_in_it():
    model, x = Autocast().train(), torch.randn(4, 8)
    trace = tl.trace(model, x)
    assert trace["linear_1"].dtype == "bfloat16" and trace["linear_2"].dtype == "float32"
    forward = validate_forward_pass(model, x)
    assert forward.passed and {r["status"] for r in forward.rows} == {"passed"}
    assert validate_backward_pass(model, x).passed


class Sparse(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        mask = (x > 0).float().to_sparse()
        return torch.sparse.mm(mask, self.a.weight.t()) + self.a(x)


def test_a_sparse_value_validates_and_saves(tmp_path):
    model, x = Sparse().train(), torch.randn(3, 8)
    trace = tl.trace(model, x)
    assert trace["to_sparse_1"].out.layout == torch.sparse_coo
    trace.save(tmp_path / "sparse.tlens")
    loaded = tl.load(tmp_path / "sparse.tlens")
    assert torch.equal(loaded["to_sparse_1"].out.to_dense(), (x > 0).float())
    assert validate_forward_pass(model, x).passed
    assert validate_backward_pass(model, x).passed


class RoundThrough(torch.autograd.Function):
    """A straight-through estimator: rounds forward, passes the gradient unchanged back."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, grad):
        return grad


class Quantized(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(RoundThrough.apply(self.a(x)))


def test_backward_validation_goes_through_a_custom_functions_own_backward():
    torch.manual_seed(0)
    model, x = Quantized().train(), torch.randn(2, 8)
    trace = tl.trace(model, x)
    assert [op.func for op in trace if op.kind == "op"] == ["linear", "mul", "round", "div",
                                                          "linear"]
    report = validate_backward_pass(model, x)
    assert report.passed
    # the straight-through gradient reached the first linear (round's own would be zero)
    assert [r["status"] for r in report.rows if r["label"] == "linear_1"] == ["passed"]


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)
        self.reentrant = reentrant

    def forward(self, x):
        for layer in (self.a, self.b):
            x = checkpoint.checkpoint(layer, x, use_reentrant=self.reentrant).relu() + x
        return x


def test_activation_checkpointing_validates_and_reentrant_is_refused_typed():
    x = torch.randn(2, 8, requires_grad=True)
    assert validate_backward_pass(Checkpointed(False).train(), x).passed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(TorchLensError) as err:
            validate_backward_pass(Checkpointed(True).train(), x)
    assert err.value.code == "reentrant_checkpoint"
    assert "use_reentrant=False" in err.value.teach[0]


class Jagged(nn.Module):
    """Two sequences of different lengths as one nested (jagged) tensor."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        nested = torch.nested.nested_tensor([x[0, :2], x[0, 2:]], layout=torch.jagged)
        return torch.cat(self.a(nested).unbind(), 0)


def test_a_nested_tensor_has_its_ragged_dimension_unknown_and_its_real_bytes(tmp_path):
    model, x = Jagged(), torch.randn(1, 5, 8)
    trace = tl.trace(model, x)
    (linear,) = [op for op in trace if op.func == "linear"]
    assert linear.shape == [2, None, 8] and linear.nbytes == 5 * 8 * 4
    torch.testing.assert_close(trace.output, model(x))
    assert tl.summary(model, x).rows
    trace.save(tmp_path / "jagged.tlens")
    loaded = tl.load(tmp_path / "jagged.tlens")[linear.label].out
    assert loaded.is_nested and torch.equal(loaded.values(), linear.out.values())
    assert validate_forward_pass(model, x).passed
    assert validate_backward_pass(model.train(), x).passed


class Strided(nn.Module):
    def forward(self, x):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the strided layout is a prototype
            nested = torch.nested.nested_tensor([x[0, :2], x[0, 2:]])
        return torch.nested.to_padded_tensor(nested.relu(), 0.0)


def test_a_strided_nested_tensor_in_the_forward_is_recorded():
    x = torch.randn(1, 5, 8)
    trace = tl.trace(Strided(), x)
    (relu,) = [op for op in trace if op.func == "relu"]
    assert relu.shape == [2, None, 8] and relu.nbytes == 5 * 8 * 4
    assert trace.output.shape == (2, 3, 8)


def test_an_exported_module_is_traced_summarized_and_validated():
    """``torch.export``'s module calls ``torch.ops.aten`` overloads and refuses ``eval()``."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    x = torch.randn(2, 8)
    exported = torch.export.export(model, (x,)).module()
    trace = tl.trace(exported, x)
    assert [(op.label, op.params) for op in trace if op.kind == "op"] == [
        ("linear_1", ["0.weight", "0.bias"]), ("relu_1", []), ("linear_2", ["2.weight", "2.bias"])]
    assert trace["linear_1"].flops == 2 * 2 * 8 * 8
    torch.testing.assert_close(trace.output, model(x))
    flags = [m.training for m in exported.modules()]
    receipt = tl.summary(exported, x).receipt
    assert receipt.verified and not receipt.restored_flags
    assert [m.training for m in exported.modules()] == flags
    assert validate_forward_pass(exported, x).passed


def _conv_net():
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(inplace=True)).eval()


def test_surfaces_called_inside_inference_mode_run_and_leave_it_on():
    torch.manual_seed(0)
    model, x = _conv_net(), torch.randn(1, 3, 8, 8)
    with torch.inference_mode():
        made = x.clone()  # an inference tensor: no version counter
        expected = model(made)
        trace = tl.trace(model, x)
        assert torch.equal(trace.output, expected) and torch.equal(trace["relu_1"].out, expected)
        assert tl.summary(model, made).receipt.verified
        assert validate_forward_pass(model, made).passed
        recording = tl.record(model, [made, made], save=["relu_1"], progress=False)
        assert torch.equal(recording["relu_1"], torch.cat([expected, expected]))
        assert torch.is_inference_mode_enabled()
    assert torch.equal(tl.trace(model, made).output, expected)  # made there, traced here


def test_a_model_built_in_inference_mode_is_refused_before_its_forward():
    with torch.inference_mode():
        model = nn.Linear(4, 4)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model, torch.randn(2, 4))
    assert err.value.code == "inference_parameters" and "outside" in err.value.teach[0]


class WriteThroughAView(nn.Module):
    """Longformer's attention masking: a view read, then written through a view of it, then
    read again (through itself and its base)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 6)

    def forward(self, x):
        y = self.lin(x)
        v = y.view(2, 3)
        t = v.t()
        early = (t * 3).sum()
        t[:1] = 0.0
        return (v * v).sum() + early + (y * y).sum()


def test_a_view_written_through_another_view_validates_backward():
    torch.manual_seed(0)
    report = validate_backward_pass(WriteThroughAView(), torch.randn(1, 4))
    rows = {row["label"]: row for row in report.rows}
    assert report.passed and rows["linear_1"]["status"] == "passed"
    # autograd's hook on the view sees only its early read: nothing to compare with
    assert rows["view_1"]["status"] == rows["t_1"]["status"] == "skipped"
    assert "written in place later" in rows["view_1"]["reason"]


def test_backward_validation_survives_a_view_written_twice_through_views_of_it():
    # Longformer masks its banded attention scores so, and torch crashed the process when the
    # recorder hooked the view after the second write (before its grad_fn was read): run it in
    # a child, so a crash is this test's failure, not the end of the test run
    code = (
        "import torch, torchlens as tl\n"
        "class M(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.lin = torch.nn.Linear(4, 6)\n"
        "    def forward(self, x):\n"
        "        s = self.lin(x).view(2, 4, 6).transpose(1, 0)\n"
        "        first = s[:, :1, :2]\n"
        "        s[:, :1, :2] = torch.full_like(first, -1.0).where(first > 0, first)\n"
        "        last = s[:, -1:, -2:]\n"
        "        s[:, -1:, -2:] = torch.full_like(last, -1.0).where(last > 0, last)\n"
        "        return (s * s).sum()\n"
        "torch.manual_seed(0)\n"
        "print(tl.validation.validate_backward_pass(M(), torch.randn(8, 4)).passed)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env())
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "True"


class ResidualInFloat32(nn.Module):
    """Mamba's block: the residual is ``hidden.to(torch.float32)``, which returns ``hidden``
    itself when it is float32 already, read after the branch that normalizes it."""

    def __init__(self):
        super().__init__()
        self.embed, self.norm, self.mix = nn.Linear(6, 6), nn.LayerNorm(6), nn.Linear(6, 6)

    def forward(self, x):
        hidden = self.embed(x)
        branch = self.mix(self.norm(hidden.to(torch.float32)))
        residual = hidden.to(torch.float32)
        return (residual + branch).pow(2).sum()


def test_ops_that_return_the_same_tensor_validate_backward():
    torch.manual_seed(0)
    report = validate_backward_pass(ResidualInFloat32(), torch.randn(2, 6))
    rows = {row["label"]: row for row in report.rows}
    assert report.passed and rows["linear_1"]["status"] == "passed"
    # one tensor, three ops: autograd's gradient is the tensor's, from all its reads
    assert rows["to_2"]["status"] == "skipped" and "same tensor" in rows["to_2"]["reason"]
