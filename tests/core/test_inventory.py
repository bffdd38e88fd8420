"""The one-pass inventory names and orders modules, parameters and buffers exactly as torch does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.models.zoo import PURE_CASES
from torchlens.capture.inventory import inventory, module_paths


class Shared(nn.Module):
    """A module reachable at three addresses, a buffer registered twice, a None child."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 3)
        self.b = self.a
        self.c = nn.Sequential(self.a, nn.BatchNorm1d(3))
        self.register_buffer("buf", torch.zeros(2))
        self.c.register_buffer("again", self.buf)
        self.empty = None


MODELS = [("shared", Shared())] + [(name, case.build()[0]) for name, case in PURE_CASES.items()]


@pytest.mark.parametrize("name,model", MODELS, ids=[name for name, _ in MODELS])
def test_inventory_matches_torch(name, model):
    inv = inventory(model)
    assert [(n, id(m)) for n, m in inv.modules] == [(n, id(m)) for n, m in model.named_modules()]
    assert [(n, id(p)) for n, p in inv.params] == [
        (n, id(p)) for n, p in model.named_parameters()]
    assert [(n, id(b)) for n, b in inv.buffers] == [(n, id(b)) for n, b in model.named_buffers()]
    first: dict[int, str] = {}
    aliases: dict[str, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        if first.setdefault(id(p), n) != n:
            aliases.setdefault(first[id(p)], []).append(n)
    assert inv.aliases == aliases
    assert inv.param_ids == {id(p): n for n, p in model.named_parameters()}
    assert inv.buffer_ids == {id(b): n for n, b in model.named_buffers()}
    assert [(n, id(m)) for n, m in module_paths(model)] == [
        (n, id(m)) for n, m in model.named_modules(remove_duplicate=False)]


def test_shared_module_aliases():
    inv = inventory(Shared())
    assert inv.aliases == {"a.weight": ["b.weight", "c.0.weight"], "a.bias": ["b.bias", "c.0.bias"]}
    assert [n for n, _ in inv.buffers] == ["buf", "c.1.running_mean", "c.1.running_var",
                                           "c.1.num_batches_tracked"]


@pytest.mark.parametrize("surface,walks", [
    (lambda m, x: tl.trace(m, x, save=None), 1),
    (lambda m, x: tl.trace(m, x, save=["linear_2"]), 1),  # save= labels are checked on it
    (lambda m, x: tl.record(m, x, save=["linear_2"], progress=False), 1),
    (lambda m, x: tl.summary(m, x), 1),
    (lambda m, x: tl.validation.validate_forward_pass(m, x), 1),
    # a forward per input, and each input's code may change the model: a walk each
    (lambda m, x: tl.record(m, [x, x, x], save=["linear_2"], progress=False), 1 + 3),
], ids=["trace", "trace-labels", "record", "summary", "validation", "record-3-inputs"])
def test_a_surface_walks_the_model_once_per_forward(monkeypatch, surface, walks):
    """The entry checks take the walk the surface made, when no code ran in between."""
    import torchlens.capture.inventory as inv_module

    model, x = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)), torch.rand(2, 4)
    surface(model, x)  # a summary's warm-up walks once more, the first time only
    seen = []
    monkeypatch.setattr(inv_module, "module_paths",
                        lambda m: seen.append(m) or module_paths(m))
    surface(model, x)
    assert len(seen) == walks
