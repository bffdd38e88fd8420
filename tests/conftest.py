"""Shared fixtures: count a model's forward calls, register plugins for one test, snapshot RNG."""

from __future__ import annotations

import pytest
import torch

from torchlens.plugins import get_plugin_manager


class ForwardCounter:
    """Counts calls of one module's forward (a pre-hook on that module only): ``n`` all of them,
    ``fake`` those on fake tensors (rung 3's allocation-free checks), ``real`` the others."""

    def __init__(self, model: torch.nn.Module):
        self.n = self.fake = 0
        self.handle = model.register_forward_pre_hook(self._hook)

    @property
    def real(self) -> int:
        return self.n - self.fake

    def _hook(self, module, args):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        self.n += 1
        self.fake += any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())


@pytest.fixture
def count_forwards():
    """``calls = count_forwards(model)``; ``calls.n`` is how often ``model.forward`` ran."""
    counters: list[ForwardCounter] = []

    def attach(model: torch.nn.Module) -> ForwardCounter:
        counters.append(ForwardCounter(model))
        return counters[-1]

    yield attach
    for c in counters:
        c.handle.remove()


@pytest.fixture
def register_plugin():
    """``register_plugin(obj)`` registers a plugin object for this test; unregistered in finally."""
    pm = get_plugin_manager()
    registered: list[object] = []

    def register(obj: object) -> object:
        pm.register(obj)
        registered.append(obj)
        return obj

    try:
        yield register
    finally:
        for obj in registered:
            pm.unregister(obj)


def rng_state() -> list[torch.Tensor]:
    """Every global RNG stream: CPU, plus each CUDA device where CUDA is present."""
    states = [torch.get_rng_state()]
    if torch.cuda.is_available():
        states += torch.cuda.get_rng_state_all()
    return states


@pytest.fixture
def rng_snapshot():
    """``same = rng_snapshot()``, later ``assert same()``: the global RNG did not advance."""

    def take():
        before = rng_state()
        return lambda: all(torch.equal(a, b) for a, b in zip(before, rng_state()))

    return take
