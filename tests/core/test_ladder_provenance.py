"""The provenance record: its schema on every rung, and that it survives save/load exactly."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.types import InputSpec

FIELDS = {"schema", "version", "origin", "surface", "strategy", "slots", "seed", "generator",
          "probe_diary", "resolver", "recapture", "probe_budget"}
SYNTH_SLOT = {"slot", "keyword", "kind", "shape", "dtype", "recipe", "low", "high", "source"}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 4)
        self.fc2 = nn.Linear(4, 2)

    def forward(self, x, gain=None):
        y = self.fc2(torch.relu(self.fc1(x)))
        return y if gain is None else y * gain


class Wide(nn.Module):
    """A first candidate (1, 6) fails; (1, 8, 6) verifies: the diary has two rows."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 2)

    def forward(self, x):
        if x.dim() != 3:
            raise ValueError("wants (batch, seq, 6)")
        return self.fc(x)


def dumped(record: dict) -> str:
    return json.dumps(record, sort_keys=True)


def traces() -> dict[str, tl.Trace]:
    model = Net().eval()
    return {
        "gold": tl.trace(model, torch.rand(2, 6), input_kwargs={"gain": torch.ones(1)}),
        "declared": tl.trace(model, input_shape={"x": InputSpec((3, 6), low=-1.0, high=1.0)}),
        "inferred": tl.trace(Wide()),
    }


@pytest.fixture(scope="module")
def by_origin():
    return traces()


def test_every_trace_has_the_versioned_schema(by_origin):
    """Every trace has trace.provenance with the DESIGN.md schema: origin, slots, seed and
    generator, strategy, probe diary, resolver facts, recapture note -- JSON-serializable."""
    for origin, trace in by_origin.items():
        prov = trace.provenance
        assert set(prov) == FIELDS, origin
        assert prov["schema"] == "torchlens.provenance" and prov["version"] == 1
        assert prov["origin"] == origin and prov["surface"] == "trace"
        json.dumps(prov)


def test_gold_records_what_the_caller_passed(by_origin):
    """Gold traces say gold and record what the caller passed (each slot's shape, dtype,
    device), with no seed, generator or diary."""
    prov = by_origin["gold"].provenance
    assert prov["strategy"] == "caller" and prov["seed"] is None and prov["probe_diary"] == []
    assert prov["slots"] == [
        {"slot": "0", "keyword": False, "kind": "tensor", "shape": [2, 6], "dtype": "float32",
         "device": "cpu", "recipe": "caller"},
        {"slot": "gain", "keyword": True, "kind": "tensor", "shape": [1], "dtype": "float32",
         "device": "cpu", "recipe": "caller"},
    ]


def test_gold_non_tensor_arguments_are_described():
    trace = tl.trace(Net().eval(), (torch.rand(1, 6), 2.0))
    slot = trace.provenance["slots"][1]
    assert slot["kind"] == "float" and slot["recipe"] == "caller" and slot["repr"] == "2.0"


def test_declared_record_has_slots_with_recipes_and_bounds(by_origin):
    prov = by_origin["declared"].provenance
    assert prov["strategy"] == "input_shape" and prov["probe_diary"] == []
    assert prov["seed"] == 0 and prov["generator"]
    (slot,) = prov["slots"]
    assert set(slot) == SYNTH_SLOT
    assert (slot["slot"], slot["keyword"], slot["shape"], slot["dtype"], slot["recipe"],
            slot["low"], slot["high"]) == ("x", True, [3, 6], "float32", "spec", -1.0, 1.0)
    assert prov["recapture"] is None and prov["resolver"] is None


def test_inferred_record_has_the_diary_and_the_recapture(by_origin):
    prov = by_origin["inferred"].provenance
    assert prov["strategy"] == "inference"
    assert [r["outcome"] for r in prov["probe_diary"]] == ["failed", "verified"]
    assert prov["probe_diary"][0]["error_code"] == "ValueError"
    assert prov["slots"][0]["shape"] == [1, 8, 6] and prov["slots"][0]["recipe"] == "uniform_0_1"
    assert prov["recapture"]["reason"]


@pytest.mark.parametrize("origin", ["gold", "declared", "inferred"])
def test_provenance_survives_save_and_load_exactly(origin, by_origin, tmp_path):
    """Issue 3: the record "survives Trace.save / tl.load exactly (test the JSON equal before
    and after), so a synthesized trace can never pass for a real one"."""
    trace = by_origin[origin]
    path = tmp_path / f"{origin}.tlens"
    trace.save(path)
    loaded = tl.load(path)
    assert dumped(loaded.provenance) == dumped(trace.provenance)
    assert loaded.provenance == json.loads(json.dumps(trace.provenance))
    assert loaded.provenance["origin"] == origin
    loaded.save(tmp_path / "again.tlens")
    assert dumped(tl.load(tmp_path / "again.tlens").provenance) == dumped(trace.provenance)


def test_explain_says_where_the_input_came_from(by_origin):
    """torchlens.debug.explain(trace): provenance and advisories in plain words."""
    gold = tl.debug.explain(by_origin["gold"])
    assert "gold" in gold and "synthesized nothing" in gold and "Advisories: none." in gold
    declared = tl.debug.explain(by_origin["declared"])
    assert "input_shape=" in declared and "seed 0" in declared
    assert "values spec in [-1.0, 1.0)" in declared
    assert "nongold_semantics_unavailable" in declared
    inferred = tl.debug.explain(by_origin["inferred"])
    assert "Probe diary (2 row(s)" in inferred and "failed [ValueError" in inferred
    assert "Recapture: once" in inferred
    assert "does not prove canonical preprocessing" in inferred
    assert "State: pinned eval + no-grad; restoration verified" in inferred


def test_explain_lists_advisories(by_origin):
    trace = by_origin["gold"]
    trace.annotations["capture_advisories"].append(
        {"code": "parameter_created_in_forward", "message": "lazy.weight was created"})
    try:
        text = tl.debug.explain(trace)
    finally:
        trace.annotations["capture_advisories"].pop()
    assert "Advisories (1):" in text and "parameter_created_in_forward: lazy.weight" in text
