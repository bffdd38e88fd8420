"""Models on the meta device through the metadata surfaces, and typed refusals where values are
needed (issue 15). tl.draw on meta is tested with the renderers, in tests/hf/test_meta_hf.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.models.zoo import PURE_CASES


def on_meta(name: str) -> tuple[nn.Module, nn.Module, object]:
    """The zoo model built on meta, the same model on the CPU, and the CPU input."""
    real, x = PURE_CASES[name].build()
    with torch.device("meta"):
        meta, _ = PURE_CASES[name].build()
    return meta.eval(), real.eval(), x


def test_trace_summary_save_and_dry_run_on_a_meta_model(tmp_path):
    meta, real, x = on_meta("cnn_bn")
    shape = tuple(x.shape)
    log = tl.trace(meta, input_shape=shape, save=None)
    gold = tl.trace(real, x, save=None)
    assert [(op.label, op.shape, op.flops) for op in log] == [
        (op.label, op.shape, op.flops) for op in gold]
    assert log.meta["values"] == "meta" and log.inputs[0].device == "meta"
    summary = tl.summary(meta, input_shape=shape)
    assert summary.totals["total_params"] == sum(p.numel() for p in real.parameters())
    assert summary.totals["flops"] == tl.summary(real, input_shape=shape).totals["flops"]
    log.save(tmp_path / "t.tl")
    assert [op.shape for op in tl.load(tmp_path / "t.tl")] == [op.shape for op in log]
    rows = tl.recording.dry_run(meta, input_shape=shape, save=["conv2d_1"])
    assert rows[0]["bytes"] == 4 * torch.Size(rows[0]["shape"]).numel()


def test_the_receipt_on_meta_verifies_structure_and_says_there_are_no_values():
    meta, _, x = on_meta("cnn_bn")
    meta.train()
    summary = tl.summary(meta, input_shape=tuple(x.shape))
    receipt = summary.receipt
    n = sum(1 for _ in [*meta.parameters(), *meta.buffers()])
    assert receipt.verified and receipt.no_values == n
    assert "no values to hash" in receipt.scope and "no values to hash" in str(summary)
    assert meta.training and all(m.training for m in meta.modules())  # flags restored


def test_rung_three_on_a_meta_model():
    meta, _, x = on_meta("mlp")
    summary = tl.summary(meta)
    assert summary.provenance["origin"] == "inferred"
    assert summary.totals["total_params"] == sum(p.numel() for p in meta.parameters())


def test_what_needs_values_refuses_before_any_forward(count_forwards):
    meta, _, x = on_meta("mlp")
    calls = count_forwards(meta)
    cases = [
        lambda: tl.trace(meta, input_shape=tuple(x.shape)),  # save="all" by default
        lambda: tl.trace(meta, input_shape=tuple(x.shape), intervention_ready=True, save=None),
        lambda: tl.record(meta, [torch.zeros(x.shape, device="meta")], save=["linear_1"],
                          progress=False),
        lambda: tl.validation.validate_forward_pass(meta, input_shape=tuple(x.shape)),
        lambda: tl.validation.validate_backward_pass(meta, input_shape=tuple(x.shape)),
    ]
    for call in cases:
        with pytest.raises(tl.TorchLensError) as err:
            call()
        assert err.value.code == "meta_values_unavailable", err.value
        assert any("save=None" in t or "input_shape" in t for t in err.value.teach)
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(meta, x)  # a real CPU tensor for a meta model
    assert err.value.code == "meta_values_unavailable"
    assert f"input_shape={tuple(x.shape)}" in err.value.teach[0]
    assert calls.n == 0
    log = tl.trace(meta, torch.zeros(x.shape, device="meta"), save=None)
    with pytest.raises(tl.TorchLensError) as err:
        log.decode_output()
    assert err.value.code == "meta_values_unavailable"


class Routed(nn.Module):
    """Picks rows by a boolean mask, as MoE routing does: data-dependent."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(4, 1)
        self.expert = nn.Linear(4, 4)

    def forward(self, x):
        chosen = x[self.gate(x).squeeze(-1) > 0]
        return self.expert(chosen).sum()


def test_a_data_dependent_op_names_itself_and_carries_the_partial_trace():
    with torch.device("meta"):
        model = Routed()
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(model, input_shape=(8, 4))
    assert err.value.code == "meta_op_unsupported"
    assert "getitem" in err.value.message and "smaller config" in err.value.teach[0]
    partial = err.value.partial_trace
    assert [op.func for op in partial][:4] == ["input", "linear", "squeeze", "gt"]


class _WritesThroughViews(nn.Module):
    """Two outputs each written in place through a view: on meta every storage starts at
    address 0, so telling them apart by address would make ``z``'s write ``y``'s too."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        y, z = self.a(x), self.b(x)
        y[0].add_(1)
        z[1].mul_(2)
        return y + z


# every zoo model whose forward takes one tensor, which ``input_shape=`` declares
_ONE_TENSOR = [n for n in PURE_CASES if n not in ("multi_positional", "keyword_inputs")]


@pytest.mark.parametrize("name", ["writes_through_views", *_ONE_TENSOR])
def test_a_meta_model_has_the_edges_of_the_same_model_on_the_cpu(name):
    if name == "writes_through_views":
        real, x = _WritesThroughViews().eval(), torch.randn(2, 4)
        with torch.device("meta"):
            meta = _WritesThroughViews().eval()
    else:
        meta, real, x = on_meta(name)
    log = tl.trace(meta, input_shape=tuple(x.shape), save=None)
    gold = tl.trace(real, x, save=None)
    assert [(op.label, op.parents, op.children) for op in log] == [
        (op.label, op.parents, op.children) for op in gold]
