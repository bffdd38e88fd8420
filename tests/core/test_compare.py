"""tl.compare on pure-torch models: matching, the numbers, the first divergence, files, the
command line and refusals (issue 48)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.graphs import descendants
from torchlens.cli import main


class Branchy(nn.Module):
    """Two branches joined by a residual add: a change in one branch leaves the other equal."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.left, self.right = nn.Linear(8, 8), nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        a = torch.tanh(self.left(h))
        b = torch.sigmoid(self.right(h))
        return self.out(a + b)


def _model(seed: int = 0) -> Branchy:
    torch.manual_seed(seed)
    return Branchy().eval()


X = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))



def test_identical_runs_compare_equal_with_no_row_of_difference():
    model = _model()
    cmp = tl.compare(tl.trace(model, X), tl.trace(model, X))
    assert cmp.equal and cmp.differing() == [] and cmp.first_divergence() is None
    assert {r.status for r in cmp.rows} == {"matched"} and len(cmp.rows) == len(cmp.a.ops)
    assert cmp.compared == len(cmp.rows)
    assert all(r.max_abs == 0 and r.relative == 0 and r.cosine == pytest.approx(1.0)
               and r.outside == 0 for r in cmp.rows)
    assert cmp.top(5) == []
    text = str(cmp)
    assert "0 differ" in text and "first divergence: none" in text
    assert "4 modules same tensors" in text  # both traces hold the one live model


def test_an_edit_is_found_exactly_where_it_fired_and_only_downstream_differs():
    model = _model()
    a = tl.trace(model, X)
    b = tl.trace(model, X, edits={"tanh_1": tl.edits.scale(1.5)})
    cmp = tl.compare(a, b)
    first = cmp.first_divergence()
    assert first.label == "tanh_1" and first.a == first.b == "tanh_1"
    assert first.relative == pytest.approx(0.5, rel=1e-5) and first.cosine == pytest.approx(1.0)
    differing = {r.label for r in cmp.differing()}
    assert differing <= {"tanh_1"} | descendants(a, "tanh_1")
    assert {"tanh_1", "add_1", "linear_4", "output_1"} <= differing
    assert "sigmoid_1" not in differing and "linear_3" not in differing  # the other branch
    assert cmp.top(1)[0].label == "tanh_1"
    assert [r.label for r in cmp.top(10)] == sorted(
        [r.label for r in cmp.top(10)], key=lambda lab: -cmp._by_b[lab].relative)


def test_a_modified_weight_is_the_first_divergence_and_its_module_differs():
    model = _model()
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.right.weight[0, 0] += 0.25
    cmp = tl.compare(model, other, X)
    assert cmp.names == ("model_a", "model_b")
    first = cmp.first_divergence()
    assert first.func == "linear" and first.module == "right"
    params = {row["module"]: row for row in cmp.params}
    assert params["right"]["status"] == "differ" and params["right"]["max_abs"] == \
        pytest.approx(0.25)
    assert {m: r["status"] for m, r in params.items() if m != "right"} == {
        "inp": "equal", "left": "equal", "out": "equal"}
    assert "furthest apart: right" in str(cmp)


def test_one_model_on_two_inputs_diverges_at_the_input():
    model = _model()
    y = X.clone()
    y[0, 0] += 1.0
    cmp = tl.compare(model, X, y)
    first = cmp.first_divergence()
    assert first.label == "input_1" and cmp.names == ("x", "y")
    assert first.outside == pytest.approx(1 / X.numel())


def test_a_looser_tolerance_hides_a_small_difference():
    model = _model()
    b = tl.trace(model, X, edits={"linear_1": tl.edits.add(torch.tensor(1e-4))})
    cmp = tl.compare(tl.trace(model, X), b)
    assert cmp.first_divergence().label == "linear_1"
    assert cmp.first_divergence(atol=1e-3) is None and cmp.differing(atol=1e-3) == []
    with pytest.raises(tl.TorchLensError) as err:
        cmp.first_divergence(atol=-1)
    assert err.value.code == "option_invalid"


def test_different_architectures_give_added_removed_and_changed_rows_without_error():
    torch.manual_seed(0)
    small = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    big = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.ReLU(),
                        nn.Linear(8, 2)).eval()
    x = torch.randn(2, 4)
    cmp = tl.compare(small, big, x)
    statuses = {(r.a, r.b): r.status for r in cmp.rows}
    assert statuses[("relu_1", "gelu_1")] == "changed"  # same place, another function
    changed = next(r for r in cmp.rows if r.status == "changed")
    assert changed.changes == ["function relu → gelu"]
    assert {r.b for r in cmp.rows if r.status == "added"} == {"linear_3", "relu_1"}
    assert not [r for r in cmp.rows if r.status == "removed"]
    assert sum(r.a is not None for r in cmp.rows) == len(cmp.a.ops)
    assert sum(r.b is not None for r in cmp.rows) == len(cmp.b.ops)
    text = str(cmp)
    assert "added 2" in text and "changed: relu_1 → gelu_1 in 1: function relu → gelu" in text
    assert "1 modules added" in text  # the big model's third Linear (the others hold none)


def test_a_trace_file_compares_as_the_live_trace_and_the_cli_prints_it(tmp_path, capsys):
    model = _model()
    a, b = tl.trace(model, X), tl.trace(model, X, edits={"sigmoid_1": tl.edits.zero()})
    a.save(tmp_path / "a.tlt")
    b.save(tmp_path / "b.tlt")
    live, disk = tl.compare(a, b), tl.compare(str(tmp_path / "a.tlt"), tmp_path / "b.tlt")
    assert [r.row() for r in disk.rows] == [r.row() for r in live.rows]
    assert disk.first_divergence().label == "sigmoid_1" and disk.params == []
    code = main(["diff", str(tmp_path / "a.tlt"), str(tmp_path / "b.tlt")])
    out = capsys.readouterr().out
    assert code == 0 and "first divergence: sigmoid_1 in <model>" in out
    assert main(["diff", str(tmp_path / "a.tlt"), str(tmp_path / "missing.tlt")]) == 3


def test_traces_without_values_compare_structure_and_say_so():
    model = _model()
    cmp = tl.compare(tl.trace(model, X, save=None), tl.trace(model, X, save=None))
    assert cmp.compared == 0 and all(r.values == "not saved" for r in cmp.rows)
    assert cmp.first_divergence() is None and cmp.equal
    text = str(cmp)
    assert "values: not saved on both sides" in text and 'save="all"' in text
    assert "FLOPs" in text  # the costs of both sides


def test_a_value_not_saved_is_looked_through_to_the_saved_ones_above_it():
    """Only a few sites saved: the first divergence is the first saved op that differs while
    the saved values above it (through ops not saved) agree."""
    model = _model()
    save = ["inp", "tanh_1", "sigmoid_1", "out"]
    a = tl.trace(model, X, save=save)
    b = tl.trace(model, X, save=save, edits={"left": tl.edits.add(torch.tensor(0.5))})
    cmp = tl.compare(a, b)
    assert cmp.first_divergence().label == "tanh_1"  # linear_2 (left's output) not saved
    assert cmp.compared == len(save) + 1  # and the output, which a capture always keeps


def test_several_outputs_of_one_op_are_compared_together():
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 4, batch_first=True).eval()
    x = torch.randn(2, 5, 3)
    other = copy.deepcopy(lstm)
    with torch.no_grad():
        other.weight_hh_l0.mul_(1.01)
    cmp = tl.compare(lstm, other, x)
    first = cmp.first_divergence()
    assert first.func == "lstm" and first.values == "compared" and not math.isnan(first.cosine)


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


@pytest.mark.parametrize("args,kwargs", [
    (("model", "model"), {}),
    (("trace", "trace"), {"save": None}),
    ((3, 4), {}),
])
def test_bad_arguments_refuse_before_any_forward(args, kwargs):
    model = Counting()
    trace = tl.trace(model, torch.randn(1, 2))
    model.calls = 0
    values = {"model": model, "trace": trace}
    with pytest.raises(tl.TorchLensError) as err:
        tl.compare(*[values.get(a, a) if isinstance(a, str) else a for a in args], **kwargs)
    assert err.value.code == "compare_input_invalid" and model.calls == 0
    assert "tl.compare(model_a, model_b, x)" in err.value.teach


def test_top_refuses_an_unknown_order():
    model = _model()
    cmp = tl.compare(tl.trace(model, X), tl.trace(model, X))
    with pytest.raises(tl.TorchLensError) as err:
        cmp.top(3, by="biggest")
    assert err.value.code == "option_invalid" and 'cmp.top(3, by="relative")' in err.value.teach


def test_the_numbers_are_those_of_the_values_including_views_and_nan():
    """Every row's numbers equal a direct computation on its two values (a view's are read
    from the value it rearranges, so check those too); a NaN on one side counts as outside."""
    from torchlens.compare.metrics import value_stats

    class Views(nn.Module):
        def forward(self, x):
            h = x * 2
            return h.transpose(0, 1).reshape(-1).contiguous() + 1

    x = torch.randn(3, 4)
    y = x.clone()
    y[1, 2] = float("nan")
    y[0, 0] += 0.5
    cmp = tl.compare(Views(), x, y)
    for row in cmp.rows:
        direct = value_stats(cmp.a[row.a].out, cmp.b[row.b].out, cmp.atol, cmp.rtol)
        for key in ("max_abs", "relative", "cosine", "outside"):
            got, want = getattr(row, key), direct[key]
            assert got == pytest.approx(want, rel=1e-6, nan_ok=True), (row.label, key)
    transpose = cmp._by_a["transpose_1"]
    assert transpose.outside == pytest.approx(2 / 12) and math.isnan(transpose.max_abs)
    assert cmp.first_divergence().label == "input_1"


def test_top_prints_as_a_table_and_stays_a_list_of_the_rows():
    model = _model()
    cmp = tl.compare(tl.trace(model, X), tl.trace(model, X,
                                                  edits={"tanh_1": tl.edits.scale(1.5)}))
    top = cmp.top(3)
    rows = sorted((r for r in cmp.rows if r.values == "compared" and r.relative > 0),
                  key=lambda r: -r.relative)[:3]
    assert list(top) == rows and top[0] is rows[0] and top[:2] == rows[:2] and len(top) == 3
    text = repr(top)
    lines = text.splitlines()
    assert lines[0] == f"<top 3 of {cmp.compared} compared ops, by relative>"
    assert lines[1].split() == ["label", "function", "module", "shape", "max", "abs",
                                "relative", "cosine", "outside"]
    assert len(lines) == 2 + 3 and lines[2].split()[0] == top[0].label
    assert "DiffRow(" not in text and str(top) == "\n".join(lines[1:])
    assert "\n".join("  " + line for line in lines[1:]) in str(cmp)  # print(cmp) has it too
    assert "<table>" in top._repr_html_() and top[0].label in top._repr_html_()
    assert str(cmp.top(3, by="cosine")).splitlines()[0] == lines[1]
    assert str(tl.compare(tl.trace(model, X), tl.trace(model, X)).top(3)) == \
        "no compared op differs (by relative)"
