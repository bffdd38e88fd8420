"""Metadata-only steps follow the graph of the step before (``steps/follow.py``): a step that
keeps to it is stored as that graph plus its own times and costs, and one that departs from it
(another op, another input, an in-place write, an error) is captured in full from there on.
Every step's Trace must equal a capture of the same call on its own, whichever way it went."""

from __future__ import annotations

import dataclasses
import sys
import time
import weakref

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.steps.run import StepRun

_OWN = {"time_ns", "_value", "_trace", "_reads", "_grad", "meta"}  # each capture's own


def facts(trace) -> list:
    """Everything an op states about the graph and its costs (not its time)."""
    ops = [tuple((f.name, getattr(op, f.name)) for f in dataclasses.fields(op)
                 if f.name not in _OWN) for op in trace.ops]
    calls = sorted((m.address, c.pass_num, tuple(c.ops), tuple(c.output_ops))
                   for m in trace.modules.values() for c in m.calls)
    return ops + calls


class Branchy(nn.Module):
    """One call per step; step ``k``'s forward departs from the others at ``mode[k]``."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x, mode: str = "same"):
        h = nn.functional.relu(self.a(x), inplace=mode == "flag")  # the same call, writing
        if mode == "op":  # another function in the same place
            h = torch.sigmoid(h)
        else:
            h = torch.tanh(h)
        # the same functions reading other inputs: only the graph's edges differ
        g = h * x if mode == "edge" else h * h
        if mode == "inplace":
            g.add_(1.0)
        if mode == "grow":  # a write of its shape: what ran before it is read before it
            g.unsqueeze_(0)
        if mode == "weight":  # the same call on another parameter
            out = nn.functional.linear(g, self.a.weight, self.b.bias)
        else:
            out = self.b(g)
        if mode == "longer":
            out = out.cumsum(-1)
        if mode == "raise":
            raise ValueError("step failed")
        return out


@pytest.fixture(params=["held", "checked as they run"])
def holding(request, monkeypatch):
    """Followed steps either hold their ops until they end and check them then, or (a graph
    whose ops made more than ``HOLD_BYTES``) check each op as it runs."""
    if request.param != "held":
        monkeypatch.setattr(sys.modules["torchlens.steps.run"], "HOLD_BYTES", 0)
    return request.param


def _run(modes, xs):
    model = Branchy().eval()
    followed = []
    add = StepRun.add_followed

    def spy(run, index, first, kept):
        followed.append(index)
        return add(run, index, first, kept)

    StepRun.add_followed = spy
    try:
        with tl.steps(model, save=None) as run:
            outs = [model(x=x, mode=mode) for x, mode in zip(xs, modes)]
    finally:
        StepRun.add_followed = add
    return model, run, outs, followed


@pytest.mark.parametrize("mode", ["op", "edge", "inplace", "flag", "weight", "longer", "grow"])
def test_a_step_that_departs_is_captured_as_a_capture_of_its_own(mode, holding):
    torch.manual_seed(0)
    xs = [torch.randn(2, 4) for _ in range(5)]
    modes = ["same", "same", "same", mode, "same"]
    model, run, outs, followed = _run(modes, xs)
    assert 3 not in followed and 2 in followed  # step 2 kept to step 1's graph, 3 departed
    for i, (x, m) in enumerate(zip(xs, modes)):
        alone = tl.trace(model, input_kwargs={"x": x, "mode": m}, save=None)
        assert facts(run[i]) == facts(alone), i
        assert run[i].meta["step"] == i
        assert all(op.time_ns > 0 for op in run[i].ops if op.kind == "op")  # each its own
    assert run.shared(3) == 3 and run.structures == 2
    assert run.shared(4) == 0  # back to the first graph: shared with step 0
    assert torch.equal(outs[3], model(xs[3], mode))  # the forward ran as it runs alone


def test_kept_steps_store_no_graph_and_keep_their_own_costs(holding):
    torch.manual_seed(0)

    class Growing(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(3, 3)

        def forward(self, x, cache):
            return torch.cat([cache, self.proj(x)], 0)

    model = Growing().eval()
    xs = [torch.randn(1, 3) for _ in range(6)]
    followed = []
    add = StepRun.add_followed
    StepRun.add_followed = lambda run, i, first, kept: (followed.append(i), add(run, i, first,
                                                                                   kept))[1]
    try:
        with tl.steps(model) as run:
            cache = torch.zeros(0, 3)
            inputs = []
            for x in xs:
                inputs.append((x, cache))
                cache = model(x, cache)
    finally:
        StepRun.add_followed = add
    assert followed == [1, 2, 3, 4, 5] and run.structures == 1
    for i, (x, c) in enumerate(inputs):
        alone = tl.trace(model, (x, c), save=None)
        assert facts(run[i]) == facts(alone)
        assert run[i]["cat_1"].shape == [i + 1, 3]  # each step's own shape
        assert all(op.time_ns > 0 for op in run[i].ops if op.kind == "op")
    assert run._steps[3].trace is None and run._steps[3].changed  # no graph of its own


def test_an_error_in_a_followed_step_keeps_the_steps_before_and_a_full_partial_trace(holding):
    torch.manual_seed(0)
    xs = [torch.randn(2, 4) for _ in range(4)]
    with pytest.raises(ValueError) as info:
        _run(["same", "same", "same", "raise"], xs)
    run = info.value.partial_run
    assert run.captured == [0, 1, 2] and len(run) == 4
    partial = info.value.partial_trace
    assert [op.func for op in partial.ops if op.kind == "op"] == [
        "linear", "relu", "tanh", "mul", "linear"]
    assert [op.inplace for op in partial.ops] == [False] * len(partial.ops)
    assert partial.ops[-1].parents == ["mul_1"]


def test_steps_that_save_or_edit_are_captured_in_full():
    torch.manual_seed(0)
    model = Branchy().eval()
    xs = [torch.randn(2, 4) for _ in range(3)]
    for kw in ({"save": ["a"]}, {"edits": {"tanh_1": tl.edits.zero()}}):
        add = StepRun.add_followed
        StepRun.add_followed = lambda *a: pytest.fail("a step that saves or edits followed")
        try:
            with tl.steps(model, **kw) as run:
                for x in xs:
                    model(x)
        finally:
            StepRun.add_followed = add
        assert run.structures == 1 and run.captured == [0, 1, 2]


class Napping(nn.Module):
    """A submodule that sleeps when told to: its call takes time no op of it takes."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.nap = 0.0

    def forward(self, x):
        if self.nap:
            time.sleep(self.nap)
        return self.lin(x)


class Sleepy(nn.Module):
    def __init__(self):
        super().__init__()
        self.slow = Napping()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.relu(self.slow(x)))


@pytest.mark.parametrize("save", [None, ["head"]])
def test_steps_sharing_a_graph_keep_their_own_module_call_times(save):
    torch.manual_seed(0)
    model, xs = Sleepy().eval(), torch.randn(5, 3, 4)
    with tl.steps(model, save=save) as run:
        for k, x in enumerate(xs):
            model.slow.nap = 0.05 if k == 3 else 0.0
            model(x)
    assert run.structures == 1 and run.shared(3) == 0  # step 3 is rebuilt from step 0's graph
    took = [run[k].modules["slow"].calls[0].time_ns for k in range(5)]
    assert took[3] >= 50e6 and all(t < 50e6 for i, t in enumerate(took) if i != 3)
    assert sum(op.time_ns for op in run[3].ops) < 50e6  # the nap is the call's, no op's
    assert run[3].modules["head"].calls[0].time_ns < 50e6
    assert run[0].modules["slow"].calls[0].time_ns < 50e6  # the shared graph is not changed


class Counting(nn.Module):
    """Returns a plain number beside its tensor, as a loop's step counter might."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x), {"calls": self.calls, "done": self.calls > 3}


@pytest.mark.parametrize("save", [None, ["lin"]])
def test_a_plain_value_in_a_steps_output_is_that_steps_own(save):
    torch.manual_seed(0)
    model, xs = Counting().eval(), torch.randn(5, 3, 4)
    with tl.steps(model, save=save) as run:
        for x in xs:
            model(x)
    assert run.structures == 1 and run.shared(4) == 0
    values = [run[k].output_structure["items"][1]["items"] for k in range(5)]
    assert [v[0]["value"] for v in values] == [1, 2, 3, 4, 5]
    assert [v[1]["value"] for v in values] == [False, False, False, True, True]
    assert run[0].output_structure["items"][1]["items"][0]["value"] == 1


class Flowing(nn.Module):
    """The same calls every step; ``mode`` (and the input's layout) change only which tensor
    a call reads."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x, mode="same"):
        u = x.contiguous()  # x itself when it is contiguous: later reads of x read this op's
        h = self.a(u)
        d = nn.functional.dropout(h, 0.5, training=False)  # h itself, again
        p, q = torch.tanh(d), torch.sigmoid(x)
        c = torch.cat([q, p] if mode == "swap" else [p, q], -1)  # a sequence of tensors
        s = torch.add(c[..., :4], other=p if mode == "kw" else q)  # a tensor keyword
        return self.b(s * h)


def test_a_step_is_checked_by_how_its_tensors_flowed():
    """A followed step whose calls, and whose tensors' flow from op to op, are those of a step
    checked in full is proven by that (and costs only its shapes): a step whose tensors flowed
    otherwise, with the very same calls, is checked in full and departs."""
    from torchlens.steps.follow import Follower

    torch.manual_seed(0)
    model = Flowing().eval()
    modes = ["same", "same", "same", "swap", "same", "same", "same", "kw", "same", "same",
             "same", "same", "same"]
    xs = [torch.randn(2 + (k == 10), 4) for k in range(len(modes))]
    xs[5] = torch.randn(4, 2).t()  # not contiguous: ``x.contiguous()`` makes a new tensor
    proofs = {}
    flowed, each = Follower._costs_of, Follower._check_each

    def by_flow(self, *args):
        proofs[run.count - 1] = "flow"
        return flowed(self, *args)

    def in_full(self, *args):
        proofs[run.count - 1] = "full"
        return each(self, *args)

    Follower._costs_of, Follower._check_each = by_flow, in_full
    try:
        with tl.steps(model, save=None) as run:
            for x, mode in zip(xs, modes):
                model(x, mode)
    finally:
        Follower._costs_of, Follower._check_each = flowed, each
    for i, (x, mode) in enumerate(zip(xs, modes)):
        alone = tl.trace(model, (x, mode), save=None)
        assert facts(run[i]) == facts(alone), i
    # each change of flow is checked in full and is a graph of its own (or an earlier one)
    assert [run.shared(i) for i in range(len(modes))] == [0, 0, 0, 3, 0, 5, 0, 7, 0, 0, 0, 0, 0]
    assert proofs[2] == proofs[9] == proofs[11] == "flow"  # the same flow as a step before
    assert proofs[1] == proofs[3] == proofs[5] == proofs[7] == "full"
    assert proofs[10] == "flow" and run[10]["tanh_1"].shape == [3, 4]  # its own shapes
    assert run[11]["tanh_1"].shape == [2, 4]


class Witness(nn.Module):
    """Notes, at its last op, whether a tensor its forward let go of is still alive."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.alive: list[bool] = []

    def forward(self, x):
        h = torch.tanh(self.lin(x))
        seen = weakref.ref(h)
        y = torch.sigmoid(h)
        del h
        self.alive.append(seen() is not None)
        return y * 2


@pytest.mark.parametrize("cap", [None, 0])
def test_a_followed_step_holds_its_tensors_until_it_ends_only_below_the_cap(cap, monkeypatch):
    """``HOLD_BYTES``: a graph whose ops made at most that many bytes is followed holding its
    ops' tensors to the step's end (they are checked together then); above it, nothing is
    held: each op is checked as it runs and its tensors go when the forward lets them go."""
    if cap is not None:
        monkeypatch.setattr(sys.modules["torchlens.steps.run"], "HOLD_BYTES", cap)
    torch.manual_seed(0)
    model, xs = Witness().eval(), torch.randn(4, 2, 4)
    with tl.steps(model, save=None) as run:
        for x in xs:
            model(x)
    held = cap is None
    # step 0 is captured in full (it keeps nothing): the followers hold, or not
    assert model.alive == [False] + [held] * 3
    model.alive.clear()
    model(xs[0])
    assert model.alive == [False]  # the block's end: the model's own forward again
    assert run.structures == 1
    for i, x in enumerate(xs):
        assert facts(run[i]) == facts(tl.trace(model, x, save=None))


class Aliasing(nn.Module):
    """``w.contiguous()`` returns ``w`` itself when ``x`` has one row (a read of ``w`` after it
    is a read of that call's output) and a copy, left unused, otherwise."""

    def forward(self, x):
        w = x.t()
        w.contiguous()
        return torch.relu(w)


def test_a_call_returning_a_tensor_it_was_given_is_part_of_the_flow():
    torch.manual_seed(0)
    model = Aliasing().eval()
    xs = [torch.randn(1 + (k == 3), 4) for k in range(6)]
    with tl.steps(model, save=None) as run:
        for x in xs:
            model(x)
    for i, x in enumerate(xs):
        assert facts(run[i]) == facts(tl.trace(model, x, save=None)), i
    assert run[3]["relu_1"].parents == ["t_1"] and run[4]["relu_1"].parents == ["contiguous_1"]
    assert [run.shared(i) for i in range(6)] == [0, 0, 0, 3, 0, 0]


class Dense(nn.Module):
    """A DenseNet block's pattern: each layer reads the list of the features so far, and the
    list grows after the call read it (at the end, with a tensor made before those calls)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(4 * (k + 1), 4) for k in range(3))

    def forward(self, x):
        early = torch.tanh(x)
        features = [x]
        for layer in self.layers:
            features.append(torch.relu(layer(torch.cat(features, -1))))
        features.append(early)
        return torch.cat(features, -1)


def test_a_list_a_call_read_is_read_as_the_call_saw_it(holding):
    torch.manual_seed(0)
    model, xs = Dense().eval(), torch.randn(4, 2, 4)
    with tl.steps(model, save=None) as run:
        for x in xs:
            model(x)
    assert run.structures == 1
    for i, x in enumerate(xs):
        assert facts(run[i]) == facts(tl.trace(model, x, save=None)), i
    assert run[3]["cat_1"].parents == ["input_1"]
    assert run[3]["cat_2"].parents == ["input_1", "relu_1"]


def test_inside_a_pinned_block_a_step_does_not_follow_and_equals_its_own_capture():
    """A pinned block guards the parameters against writes, which only the recorder does: the
    follower then leads nothing, and each step is recorded in full."""
    from torchlens.capture.policy import pinned

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    xs = [torch.rand(1, 4) for _ in range(3)]
    with pinned(model, "summary"), tl.steps(model) as run:
        outs = [model(x) for x in xs]
    for i, x in enumerate(xs):
        with torch.no_grad():
            assert facts(run[i]) == facts(tl.trace(model, x, save=None))
            assert torch.equal(outs[i], model(x))
