"""Lazy modules: materialize during the one capture; refuse where a probe would guess."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.parameter import is_lazy

import torchlens as tl
from tests.models.zoo import BuildsInForward


def lazy_net():
    return nn.Sequential(nn.LazyLinear(5), nn.ReLU(), nn.LazyLinear(2))


def lazy_conv():
    return nn.Sequential(nn.LazyConv2d(4, 3), nn.ReLU())


@pytest.mark.parametrize("build,x", [(lazy_net, torch.rand(2, 7)),
                                     (lazy_conv, torch.rand(1, 3, 8, 8))])
def test_gold_rung_materializes_during_the_one_capture(build, x):
    model = build()
    trace = tl.trace(model, x)
    assert not any(is_lazy(p) for p in model.parameters())
    assert trace.num_params == sum(p.numel() for p in model.parameters())
    assert all(info["shape"] for info in trace.params.values())
    ops = [op.func for op in trace if op.kind == "op"]
    assert "empty" not in ops and "kaiming_uniform_" not in ops


def test_declared_rung_materializes_and_summary_reports_geometry():
    model = lazy_net()
    s = tl.summary(model, input_shape=(2, 7))
    assert s.totals["total_params"] == 7 * 5 + 5 + 5 * 2 + 2
    assert s.receipt.verified
    assert s.receipt.materialized == {"0.weight": [5, 7], "0.bias": [5], "2.weight": [2, 5],
                                      "2.bias": [2]}
    assert "materialized" in str(s)


def test_zero_argument_rung_refuses_before_probing():
    model = lazy_net()
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    for verb in (tl.trace, tl.summary):
        with pytest.raises(tl.TorchLensError) as err:
            verb(model)
        assert err.value.code == "lazy_uninitialized"
        assert "model(x)" in err.value.teach[0] and "torch.no_grad()" in err.value.teach[0]
    assert not calls
    assert all(is_lazy(p) for p in model.parameters())


def test_lazy_buffers_refuse_at_entry_on_every_rung():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.LazyBatchNorm2d())
    for kwargs in ({}, {"input_shape": (1, 3, 8, 8)}):
        with pytest.raises(tl.TorchLensError) as err:
            tl.summary(model, **kwargs)
        assert err.value.code == "lazy_uninitialized"
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, torch.rand(1, 3, 8, 8))
    assert err.value.code == "lazy_uninitialized"


def test_the_taught_remedy_works():
    model = lazy_net()
    x = torch.rand(2, 7)
    with torch.no_grad():
        model(x)
    assert tl.summary(model).provenance["origin"] == "inferred"


def test_intervention_ready_baseline_and_lazy_refusal():
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(lazy_net(), torch.rand(2, 7), intervention_ready=True)
    assert err.value.code == "state_baseline_unavailable"
    model = nn.Linear(3, 2)
    trace = tl.trace(model, torch.rand(1, 3), intervention_ready=True)
    assert trace.meta["state_baseline"]


def test_module_built_inside_forward_is_disclosed():
    model = BuildsInForward()
    trace = tl.trace(model, torch.rand(2, 3))
    rows = trace.annotations["capture_advisories"]
    assert {r["parameter"] for r in rows} == {"lazy.weight", "lazy.bias"}
    assert all(r["code"] == "parameter_created_in_forward" and r["module"] == "lazy"
               for r in rows)
    assert {tuple(r["shape"]) for r in rows} == {(4, 3), (4,)}
    assert trace.params["lazy.weight"]["shape"] == [4, 3]
    assert trace.modules["lazy"].type == "LazyLinear" or trace.modules["lazy"].type == "Linear"
    assert trace.num_params == sum(p.numel() for p in model.parameters())


class TriesLazy(nn.Module):
    """Calls a lazy module on an input it cannot initialize from, catches that, goes on."""

    def __init__(self):
        super().__init__()
        self.lazy = nn.LazyLinear(3)
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        try:
            self.lazy(x.sum())  # a 0-d input has no last dimension to size the weight from
        except IndexError:
            pass
        return self.fc(x).relu()


def test_a_lazy_module_whose_initialization_raises_does_not_stop_the_recording():
    """The ops after a caught error in a lazy module's initialization are recorded, in the
    modules that run them (the pause of the recorder for initialization ends with the error)."""
    trace = tl.trace(TriesLazy(), torch.randn(2, 4), save=None)
    assert [(op.label, op.module) for op in trace.ops] == [
        ("input_1", ""), ("sum_1", ""), ("linear_1", "fc"), ("relu_1", ""), ("output_1", "")]
