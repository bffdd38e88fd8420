"""Guardrails on synthesized traces: semantics refuse, raw value reads warn once per trace."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import TorchLensError, TorchLensWarning

LABELS = ["cat", "dog", "fox", "owl", "elk"]


def classifier() -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 5)).eval()


def synthesized(kind: str, model: nn.Module | None = None) -> tl.Trace:
    model = model or classifier()
    return tl.trace(model, input_shape=(1, 6)) if kind == "declared" else tl.trace(model)


def nongold_reads(caught) -> list:
    return [w for w in caught if issubclass(w.category, TorchLensWarning)
            and w.message.code == "nongold_raw_value_read"]


# ---- derived semantics refuse -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["declared", "inferred"])
@pytest.mark.parametrize("reload", [False, True])
def test_decoded_semantics_refuse_on_synthesized_traces(kind, reload, tmp_path):
    """Spec: "Derived-semantics claims refuse. Decoded labels and top-k tables
    (log.decode_output(), log.output_table()) raise a typed refusal
    (nongold_semantics_unavailable) on a synthesized-value trace" -- also after save/load."""
    trace = synthesized(kind)
    if reload:
        trace.save(tmp_path / "t.tlens")
        trace = tl.load(tmp_path / "t.tlens")
    for call in (lambda: trace.decode_output(), lambda: trace.output_table(k=3, labels=LABELS)):
        with pytest.raises(TorchLensError) as err:
            call()
        assert err.value.code == "nongold_semantics_unavailable"
        assert any("tl.trace(model, x)" in t for t in err.value.teach)


@pytest.mark.parametrize("kind", ["declared", "inferred"])
def test_structure_shapes_params_and_costs_stay_first_class(kind):
    """Spec: "Structure, shapes, parameter facts, and measured costs all stay first-class." """
    trace = synthesized(kind)
    rows = trace.rows()
    assert [r["func"] for r in rows if r["kind"] == "op"] == ["linear", "relu", "linear"]
    assert trace.num_params == 6 * 8 + 8 + 8 * 5 + 5
    linear = trace["linear_1"]
    assert linear.shape == [1, 8] and linear.params == ["0.weight", "0.bias"]
    assert linear.time_ns > 0 and linear.flops == 2 * 6 * 8
    assert trace.total_flops is not None
    assert trace.modules["2"].calls[0].time_ns > 0


# ---- gold semantics -----------------------------------------------------------------------------


def test_gold_output_table_gives_top_k_with_labels():
    """On gold traces, output_table(k=3, labels=[...]) is the output's top-k with labels."""
    model = classifier()
    x = torch.rand(1, 6)
    trace = tl.trace(model, x)
    table = trace.output_table(k=3, labels=LABELS)
    probs = torch.softmax(model(x)[0], -1)
    top = probs.topk(3)
    assert [r["index"] for r in table] == top.indices.tolist()
    assert [r["label"] for r in table] == [LABELS[i] for i in top.indices.tolist()]
    assert [r["rank"] for r in table] == [1, 2, 3]
    assert [r["prob"] for r in table] == pytest.approx(top.values.tolist())
    decoded = trace.decode_output(k=2, labels=LABELS)
    assert decoded.text.startswith(LABELS[top.indices[0]]) and len(decoded.rows) == 2


def test_gold_labels_given_at_trace_time_are_used():
    trace = tl.trace(classifier(), torch.rand(1, 6), labels=LABELS)
    assert {r["label"] for r in trace.output_table(k=5)} == set(LABELS)


def test_gold_classifier_without_labels_gives_class_indices_and_probabilities():
    """Issue 18: a plain classifier (core only, no plugin, no labels=) on a real input gets a
    top-k table of class indices with their probabilities -- a true statement about real data."""
    x = torch.rand(1, 6)
    model = classifier()
    trace = tl.trace(model, x)
    table = trace.output_table(k=3)
    with torch.no_grad():
        top = torch.softmax(model(x)[0], -1).topk(3)
    assert [r["index"] for r in table] == top.indices.tolist()
    assert [r["prob"] for r in table] == pytest.approx(top.values.tolist())
    assert all(r["label"] is None for r in table) and [r["rank"] for r in table] == [1, 2, 3]
    decoded = trace.decode_output(k=3)
    assert decoded.source == "indices" and decoded.text.startswith(str(table[0]["index"]))


def test_gold_output_that_is_not_class_scores_is_semantics_unavailable():
    """No labels, no plugin decoder, and an output that is not (batch, classes) scores (here a
    feature map): semantics_unavailable (typed), naming labels=."""
    trace = tl.trace(nn.Conv2d(3, 4, 1).eval(), torch.rand(1, 3, 4, 4))
    with pytest.raises(TorchLensError) as err:
        trace.output_table()
    assert err.value.code == "semantics_unavailable"
    assert any("labels=" in t for t in err.value.teach)


def test_synthesized_classifier_without_labels_still_refuses():
    trace = tl.trace(classifier(), input_shape=(1, 6))
    with pytest.raises(TorchLensError) as err:
        trace.output_table()
    assert err.value.code == "nongold_semantics_unavailable"


def test_gold_labels_without_a_saved_output_say_so():
    trace = tl.trace(classifier(), torch.rand(1, 6), save=None)
    with pytest.raises(TorchLensError) as err:
        trace.output_table(labels=LABELS)
    assert err.value.code == "semantics_unavailable"
    assert any("save='all'" in t for t in err.value.teach)


# ---- the first raw value read warns once per trace ----------------------------------------------


def test_first_raw_read_warns_once_per_trace_object_not_per_op():
    """Spec: "Reading log[...].out on a synthesized-value trace warns once per trace object
    (nongold_raw_value_read)" -- not once per op."""
    trace = synthesized("declared")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for op in trace:
            op.out  # noqa: B018
        trace["2"].out  # noqa: B018  (a module's output is a raw value too)
        trace.output  # noqa: B018
    (warning,) = nongold_reads(caught)
    assert str(warning.message).startswith("nongold_raw_value_read")
    assert warning.filename == __file__


def test_two_traces_warn_twice_even_from_one_line():
    """Once per trace object, not per process: two traces give two warnings -- also under the
    default filter, when both reads happen on the same source line."""
    first, second = synthesized("declared"), synthesized("inferred")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for trace in (first, second, first, second):
            trace[-1].out  # noqa: B018
    assert len(nongold_reads(caught)) == 2


def test_a_loaded_trace_warns_again(tmp_path):
    """The warning follows the loaded trace object too: a handoff does not launder it."""
    trace = synthesized("declared")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trace[-1].out  # noqa: B018
        trace.save(tmp_path / "t.tlens")
        loaded = tl.load(tmp_path / "t.tlens")
        loaded[-1].out  # noqa: B018
        loaded[0].out  # noqa: B018
    assert len(nongold_reads(caught)) == 2


def test_filtering_by_code_acknowledges_the_warning():
    """Spec: "Filter the warning by its code to acknowledge it." """
    trace = synthesized("declared")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message="nongold_raw_value_read")
        trace[-1].out  # noqa: B018
    assert nongold_reads(caught) == []


def test_gold_traces_never_warn():
    trace = tl.trace(classifier(), torch.rand(1, 6))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for op in trace:
            op.out  # noqa: B018
        trace.output  # noqa: B018
    assert nongold_reads(caught) == []


def test_output_table_k_must_be_positive():
    import torch
    from torch import nn

    import torchlens as tl

    trace = tl.trace(nn.Linear(3, 4), torch.rand(1, 3))
    for k in (0, -1, 2.5, True):
        with pytest.raises(tl.TorchLensError) as err:
            trace.output_table(k=k, labels=list("abcd"))
        assert err.value.code == "option_invalid"
    assert len(trace.output_table(k=2, labels=list("abcd"))) == 2
