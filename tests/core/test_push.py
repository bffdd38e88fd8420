"""trace.push(edits): recomputing only the downstream ops from the recorded calls equals a re-run
with the same edits, and it refuses where the graph itself could change."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.core.test_edits import InPlace, Net, Shared, TupleOut


def _same(pushed, rerun):
    """Every op's value in the pushed trace equals the re-run's."""
    assert [op.label for op in pushed] == [op.label for op in rerun]
    for a, b in zip(pushed, rerun):
        va, vb = a.out, b.out
        va, vb = (va, vb) if isinstance(va, tuple) else ((va,), (vb,))
        for x, y in zip(va, vb):
            assert torch.allclose(x, y, atol=1e-6), a.label


def _net():
    torch.manual_seed(0)
    return Net().eval(), torch.randn(2, 5, 4)


@pytest.mark.parametrize("edits", [
    {"blocks.1.mlp": tl.edits.zero()},
    {"blocks.1": tl.edits.scale(0.5, index=(slice(None), 2))},
    {"add_2": tl.edits.add(torch.ones(8))},
    {"blocks.*.mlp": tl.edits.scale(2.0), "blocks.2": tl.edits.skip()},
    {"blocks.0.mlp.1": lambda v, op: v.flip(-1)},
], ids=["module-zero", "index", "op-add", "several", "callable"])
def test_push_equals_a_rerun_with_the_same_edits(edits):
    model, x = _net()
    clean = tl.trace(model, x, save="all", intervention_ready=True)
    pushed = clean.push(edits)
    rerun = tl.trace(model, x, edits=edits)
    _same(pushed, rerun)
    assert [r["label"] for r in pushed.edits] == [r["label"] for r in rerun.edits]
    assert [r["norm"] for r in pushed.edits] == pytest.approx([r["norm"] for r in rerun.edits])
    assert pushed.edited and pushed.meta["edits"]["engine"] == "push"
    assert 0 < pushed.meta["edits"]["recomputed_ops"] < len(clean)
    # the clean trace is left as it was
    _same(clean, tl.trace(model, x))


@pytest.mark.parametrize("case", ["inplace", "passes", "tuple"])
def test_push_through_in_place_ops_passes_and_several_outputs(case):
    torch.manual_seed(4)
    model, x, edits = {
        "inplace": (InPlace(), torch.randn(3, 5), {"linear_1": tl.edits.zero(index=(
            slice(None), 0))}),
        "passes": (Shared(), torch.randn(2, 6), {"linear_1:2": tl.edits.scale(-1.0)}),
        "tuple": (TupleOut().eval(), torch.randn(2, 4, 4), {"lstm": tl.edits.scale(3.0)}),
    }[case]
    pushed = tl.trace(model, x, intervention_ready=True).push(edits)
    _same(pushed, tl.trace(model, x, edits=edits))


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:
            return self.b(h)
        return -h


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)

    def forward(self, x):
        h = self.a(x)
        return h[h > 0].sum() + h.nonzero().shape[0]


def test_push_refuses_where_a_value_decided_the_path_or_a_shape():
    torch.manual_seed(0)
    x = torch.randn(2, 3)
    model = Branchy()
    with torch.no_grad():
        model.a.bias.fill_(5.0)  # the branch through b is taken
    trace = tl.trace(model, x, intervention_ready=True)
    with pytest.raises(tl.TorchLensError) as err:
        trace.push({"a": tl.edits.scale(-1.0)})
    assert err.value.code == "push_unsafe" and "control flow" in err.value.message
    ok = trace.push({"b": tl.edits.zero()})  # nothing downstream of b decided anything
    assert torch.equal(ok.output, torch.zeros(2, 3))
    masked = tl.trace(Masked(), x, intervention_ready=True)
    with pytest.raises(tl.TorchLensError) as err:
        masked.push({"a": tl.edits.scale(2.0)})
    assert err.value.code == "push_unsafe" and "shape depends on values" in err.value.message


def test_push_needs_values_calls_an_unchanged_model_and_a_clean_trace(tmp_path):
    model, x = _net()
    for trace in [tl.trace(model, x), tl.trace(model, x, save=None, intervention_ready=True),
                  tl.trace(model, x, save=["blocks.0"], intervention_ready=True)]:
        with pytest.raises(tl.TorchLensError) as err:
            trace.push({"blocks.0": tl.edits.zero()})
        assert err.value.code == "push_needs_values"
        assert "intervention_ready=True" in err.value.teach[0]
    ready = tl.trace(model, x, intervention_ready=True)
    ready.save(tmp_path / "t.tlt")
    with pytest.raises(tl.TorchLensError) as err:
        tl.load(tmp_path / "t.tlt").push({"blocks.0": tl.edits.zero()})
    assert err.value.code == "push_needs_values"
    with pytest.raises(tl.TorchLensError) as err:
        ready.push({"blocks.0": tl.edits.zero()}).push({"blocks.1": tl.edits.zero()})
    assert err.value.code in ("push_needs_values", "edit_invalid")
    with pytest.raises(tl.TorchLensError) as err:
        ready.push({"blocks.7": tl.edits.zero()})
    assert err.value.code == "edit_site_unknown"
    with pytest.raises(tl.TorchLensError) as err:
        ready.push({"relu_1": tl.edits.zero()})
    assert err.value.code == "edit_site_not_fired"
    with torch.no_grad():
        model.head.bias.add_(1.0)
    with pytest.raises(tl.TorchLensError) as err:
        ready.push({"blocks.0": tl.edits.zero()})
    assert err.value.code == "state_changed"
