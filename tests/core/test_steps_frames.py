"""The module frames of a step run are installed at its first captured step and kept for the
next ones (``boundaries.Kept``): between steps they capture nothing, a module given hooks or
compiled mid-run gets frames again, a step not captured runs with none, and the block leaves
every module as it found it. Each step's Trace still equals a capture of its call alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.core.test_steps_follow import facts

_CALL = "_compiled_call_impl"


class Probe(nn.Module):
    """Notes, each time it runs, whether a frame wrapper serves its calls."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen: list[bool] = []

    def forward(self, x):
        self.seen.append(_CALL in self.__dict__)
        return torch.relu(self.lin(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.probe = Probe()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.probe(x) * 2)


def _net():
    torch.manual_seed(0)
    return Net().eval(), torch.randn(5, 3, 4)


def _alone(model, x, save=None):
    """A capture of the call on its own, for comparison."""
    return facts(tl.trace(model, x, save=save))


@pytest.mark.parametrize("save", [None, ["head"]])
def test_frames_are_installed_once_and_every_module_is_left_as_found(save):
    model, xs = _net()
    wrappers = []
    with tl.steps(model, save=save) as run:
        for x in xs:
            model(x)
            wrappers.append(model.head.__dict__.get(_CALL))
    assert all(w is wrappers[0] for w in wrappers) and wrappers[0] is not None
    assert wrappers[0]._torchlens_frames  # the run's own wrapper, kept between the steps
    assert all(_CALL not in m.__dict__ for m in model.modules())
    for i, x in enumerate(xs):
        assert facts(run[i]) == _alone(model, x, save)
    assert run.structures == 1


def test_a_submodule_called_between_steps_is_not_captured():
    model, xs = _net()
    with tl.steps(model) as run:
        for x in xs:
            model(x)
            direct = model.head(x)  # through the kept frame, which captures nothing now
            assert direct.shape == (3, 2)
    assert len(run) == len(xs)
    for i, x in enumerate(xs):
        assert facts(run[i]) == _alone(model, x)
        assert [op.func for op in run[i]][-2:] == ["linear", "output"]


def test_a_module_given_a_hook_mid_run_gets_frames_again():
    model, xs = _net()
    with tl.steps(model) as run:
        model(xs[0])
        model(xs[1])
        kept = model.head.__dict__.get(_CALL)
        handle = model.probe.register_forward_hook(lambda m, a, out: out - 1.0)
        model(xs[2])  # the hook's op runs inside the probe's call
        assert model.probe.__dict__.get(_CALL) is None  # the hook route serves it now
        assert model.head.__dict__.get(_CALL) is not kept  # every frame installed again
        handle.remove()
        model(xs[3])
    assert len(run) == 4
    handle = model.probe.register_forward_hook(lambda m, a, out: out - 1.0)
    hooked = _alone(model, xs[2])
    handle.remove()
    assert facts(run[2]) == hooked and "sub" in [op.func for op in run[2]]
    assert facts(run[3]) == _alone(model, xs[3]) and facts(run[1]) == _alone(model, xs[1])
    assert [c.ops for c in run[2].modules["probe"].calls] != \
        [c.ops for c in run[1].modules["probe"].calls]
    assert all(_CALL not in m.__dict__ for m in model.modules())
    assert not model.probe._forward_hooks and not model.probe._forward_pre_hooks


def test_steps_not_captured_run_with_no_frames():
    model, xs = _net()
    with tl.steps(model, at_steps=[0, 1, 4]) as run:
        for x in xs:
            model(x)
    assert model.probe.seen == [True, True, False, False, True]
    assert run.captured == [0, 1, 4] and facts(run[4]) == _alone(model, xs[4])


def test_a_step_that_fails_leaves_the_kept_frames_serving_the_next():
    model, xs = _net()
    with tl.steps(model) as run:
        model(xs[0])
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            model(torch.randn(3, 5))  # the wrong width: the step fails inside its capture
        model(xs[1])
        model(xs[2])
    assert len(run) == 4 and run.captured == [0, 2, 3]
    assert facts(run[2]) == _alone(model, xs[1]) and facts(run[3]) == _alone(model, xs[2])
    assert all(_CALL not in m.__dict__ for m in model.modules())
