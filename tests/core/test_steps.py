"""tl.steps (issue 47): every top-level call in the block a step, against hand-written hooks
on a plain loop; chosen steps, edits on them, shared graphs, refusals and partial runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.models.zoo import BuildsInForward
from torchlens.edits import EditLog


class Cell(nn.Module):
    """A recurrent cell with a submodule, called once per time step."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(3, 5)
        self.rec = nn.Linear(5, 5)

    def forward(self, x, h):
        return torch.tanh(self.inp(x) + self.rec(h))


def _setup():
    torch.manual_seed(0)
    return Cell().eval(), torch.randn(7, 2, 3)


def _plain(cell, xs):
    """The loop by hand, with a forward hook keeping the submodule's output each step."""
    kept = []
    handle = cell.rec.register_forward_hook(lambda m, a, o: kept.append(o.detach().clone()))
    h = torch.zeros(2, 5)
    outs = []
    try:
        for x in xs:
            h = cell(x, h)
            outs.append(h)
    finally:
        handle.remove()
    return outs, kept


def test_a_python_loop_is_one_step_per_call_with_the_values_hooks_see():
    cell, xs = _setup()
    want, kept = _plain(cell, xs)
    with tl.steps(cell, save=["rec", "tanh_1"]) as run:
        h = torch.zeros(2, 5)
        for x in xs:
            h = cell(x, h)
    assert len(run) == len(xs) == len(run.steps) and run.captured == list(range(7))
    assert torch.equal(h, want[-1])  # the loop computed what it computes alone
    assert torch.allclose(run.values("rec"), torch.stack(kept))
    assert torch.allclose(run.values("tanh_1"), torch.stack(want))
    assert run.structures == 1 and all(run.shared(i) == 0 for i in range(7))
    assert [op.label for op in run[5]] == [op.label for op in run[0]]
    assert run[5].meta["step"] == 5 and torch.equal(run[5]["rec"].out, kept[5])
    assert "forward" not in cell.__dict__ and "_torchlens_steps" not in cell.__dict__
    text = str(run)
    assert "7 call(s), 7 captured, 1 distinct graph(s)" in text and "= step 0" in text


def test_a_growing_value_shares_the_graph_and_keeps_each_steps_shapes():
    class Grow(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x, cache):
            cache = torch.cat([cache, self.lin(x)], dim=0)
            return torch.mm(cache.t(), cache)[:1], cache

    torch.manual_seed(0)
    model = Grow()
    cache, x = torch.zeros(0, 4), torch.randn(1, 4)
    with tl.steps(model, save="all") as run:
        for _ in range(4):
            x, cache = model(x, cache)
    assert run.structures == 1
    for i in range(4):
        assert run[i]["cat_1"].shape == [i + 1, 4] and run[i]["cat_1"].out.shape == (i + 1, 4)
        assert run[i]["mm_1"].flops == 2 * 4 * (i + 1) * 4  # each step's own FLOPs
    assert torch.equal(run[3]["cat_1"].out, cache)


def test_chosen_steps_are_captured_and_the_rest_only_counted():
    cell, xs = _setup()
    for at, captured in (([0, 3], [0, 3]), (slice(2, None, 2), [2, 4, 6]),
                         (lambda k: k % 3 == 0, [0, 3, 6]), (5, [5])):
        with tl.steps(cell, save=["rec"], at_steps=at) as run:
            h = torch.zeros(2, 5)
            for x in xs:
                h = cell(x, h)
        assert run.captured == captured and len(run) == 7
    with pytest.raises(tl.TorchLensError) as err:
        run[1]  # noqa: B018
    assert err.value.code == "step_not_captured"


def test_a_step_never_reached_refuses_when_the_block_ends():
    cell, xs = _setup()
    with pytest.raises(tl.TorchLensError) as err:
        with tl.steps(cell, save=["rec"], at_steps=[1, 9]):
            h = torch.zeros(2, 5)
            for x in xs[:3]:
                h = cell(x, h)
    assert err.value.code == "steps_not_reached" and "made 3 call(s)" in err.value.message
    assert err.value.partial_run.captured == [1] and err.value.teach == [
        "with tl.steps(model, save=['rec'], at_steps=[1]) as run: ..."]


def test_edits_apply_on_the_chosen_steps_only():
    cell, xs = _setup()
    want, _ = _plain(cell, xs)
    with tl.steps(cell, save=["tanh_1"], edits={"rec": tl.edits.zero()},
                  at_steps=[2]) as run:
        h = torch.zeros(2, 5)
        for x in xs:
            h = cell(x, h)
    assert run.captured == [2]
    assert [row["step"] for row in run.edits] == [2] and run.edits[0]["site"] == "rec"
    assert run[2].edited
    with tl.steps(cell, save=["tanh_1"], edits={"rec": tl.edits.zero()}) as every:
        h = torch.zeros(2, 5)
        for x in xs:
            h = cell(x, h)
    assert [row["step"] for row in every.edits] == list(range(7))
    # step 2 edited alone: steps before it are the plain loop's, step 2 is the edited cell's
    with tl.steps(cell, save=["tanh_1"], edits={"rec": tl.edits.zero()},
                  at_steps=lambda k: k == 2) as one:
        h = torch.zeros(2, 5)
        hs = []
        for x in xs:
            h = cell(x, h)
            hs.append(h)
    assert all(torch.equal(hs[k], want[k]) for k in range(2))
    assert torch.allclose(hs[2], torch.tanh(cell.inp(xs[2])))
    assert not torch.allclose(hs[3], want[3])  # later steps differ through the changed state
    assert one.captured == [2] and [row["step"] for row in one.edits] == [2]


def test_submodule_calls_alone_are_not_steps_and_the_state_is_a_plain_loops():
    cell, xs = _setup()
    torch.manual_seed(5)
    with tl.steps(cell, save=["rec"]) as run:
        cell.rec(torch.randn(2, 5))  # a submodule alone: not a step
        cell(xs[0], torch.zeros(2, 5))
        after = torch.rand(3)
    torch.manual_seed(5)
    cell.rec(torch.randn(2, 5))
    cell(xs[0], torch.zeros(2, 5))
    assert len(run) == 1 and torch.equal(after, torch.rand(3))  # the RNG as a plain loop's


def test_an_error_on_step_k_keeps_the_steps_before_it():
    cell, xs = _setup()

    class Boom(RuntimeError):
        pass

    with pytest.raises(Boom) as err:
        with tl.steps(cell, save=["rec"]):
            h = torch.zeros(2, 5)
            for k, x in enumerate(xs):
                if k == 4:
                    raise Boom("step 4")
                h = cell(x, h)
    assert err.value.partial_run.captured == [0, 1, 2, 3]
    assert "forward" not in cell.__dict__


def test_nesting_and_bad_arguments_refuse_typed():
    cell, xs = _setup()
    with tl.steps(cell):
        with pytest.raises(tl.TorchLensError) as err:
            with tl.steps(cell):
                pass
        assert err.value.code == "steps_nested"
    for bad in ("every", [-1], 1.5, slice(0, 4, 0)):
        with pytest.raises(tl.TorchLensError) as err:
            with tl.steps(cell, at_steps=bad):
                pass
        assert err.value.code == "option_invalid"
    with pytest.raises(tl.TorchLensError) as err:
        with tl.steps(cell, save=["nope"]):
            pass
    assert err.value.code == "save_selection_invalid"
    with pytest.raises(tl.TorchLensError) as err:
        with tl.steps(cell, edits={"rec": 3}):
            pass
    assert err.value.code == "edit_invalid"


def test_a_module_built_by_the_first_step_is_seen_by_the_later_ones():
    """The model is read once per block, and again after a step whose forward built
    parameters: the next steps name them as parameters, not as unknown tensors."""
    model = BuildsInForward()
    with tl.steps(model) as run:
        for _ in range(3):
            model(torch.rand(2, 3))
    first, later = run[0], run[2]
    assert {r["parameter"] for r in first.annotations["capture_advisories"]} == \
        {"lazy.weight", "lazy.bias"}
    assert not later.annotations["capture_advisories"]
    assert set(later.params) == {"fc.weight", "fc.bias", "lazy.weight", "lazy.bias"}
    linear = [op for op in later if op.func == "linear" and op.module == "lazy"]
    assert linear and set(linear[0].params) == {"lazy.weight", "lazy.bias"}


def test_run_edits_print_as_trace_edits_with_a_step_column():
    cell, xs = _setup()
    with tl.steps(cell, save=["tanh_1"], edits={"rec": tl.edits.zero()},
                  at_steps=[1, 3]) as run:
        h = torch.zeros(2, 5)
        for x in xs:
            h = cell(x, h)
    log = run.edits
    assert isinstance(log, EditLog) and [row["step"] for row in log] == [1, 3]
    label = run[1].edits[0]["label"]
    assert label is not None and all(row["label"] == label for row in log)  # no 'label': None
    assert [dict(row, step=k) for k, row in ((1, run[1].edits[0]), (3, run[3].edits[0]))] == \
        list(log)
    text = str(log)
    head, *rows = text.splitlines()
    assert head.split() == ["step", "site", "label", "pass", "module", "kind", "shape", "index",
                            "change", "norm"]
    assert [r.split()[:3] for r in rows] == [["1", "rec", label], ["3", "rec", label]]
    assert "{" not in text and "None" not in text
    assert repr(log).startswith("<EditLog: 2 firing(s) of 1 edit(s) over 2 step(s)>\n")
    # the same printer as trace.edits: a step's own log is that table without the step column
    assert str(run[1].edits).splitlines()[1].split() == rows[0].split()[1:]
    assert run.shared(3) == 1 and "EDITED: zero" in repr(run[3][label])  # a rebuilt step's op
