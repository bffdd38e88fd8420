"""What a capture costs beyond its forward: nothing left for the cyclic collector, the collector
as it was found, and a trace's objects built only when read."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import sdpa_flop_count

import torchlens as tl
from tests.models.zoo import PURE_CASES


def _cyclic_garbage(fn) -> int:
    fn()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(2):
            result = fn()
            del result
        gc.collect()
        return len(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("name", ["residual", "recurrent", "dict_output", "inplace"])
def test_a_dropped_capture_leaves_no_reference_cycles(name):
    model, x = PURE_CASES[name].build()
    args = x if isinstance(x, tuple) else (x,)
    with torch.no_grad():
        assert _cyclic_garbage(lambda: tl.trace(model, *args[:1], save=None)) == 0
        assert _cyclic_garbage(lambda: tl.trace(model, *args[:1])) == 0

    def read_everything():
        trace = tl.trace(model, *args[:1])
        return [op.row() for op in trace], [m.row() for m in trace.modules.values()]

    assert _cyclic_garbage(read_everything) == 0
    assert _cyclic_garbage(lambda: tl.summary(model, *args[:1])) == 0


class Attention(nn.Module):
    """FLOPs counted by formula on every call kind that has one (linear, matmul, sdpa)."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 5, 3, 2, 4).unbind(2)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return torch.matmul(y, k.transpose(-1, -2)).sum()


def test_flop_counting_leaves_no_reference_cycles():
    model, x = Attention(), torch.rand(2, 5, 8)
    shape = [2, 5, 2, 4]
    torchs = sdpa_flop_count(shape, shape, shape)  # torch's own count for these q, k, v

    def read_everything():
        trace = tl.trace(model, x, save=None)
        assert trace["scaled_dot_product_attention_1"].flops == torchs
        return [op.row() for op in trace]

    assert _cyclic_garbage(read_everything) == 0
    assert _cyclic_garbage(lambda: tl.summary(model, x)) == 0


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_left_as_it_was_found(enabled):
    seen = []
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    model.register_forward_hook(lambda *_: seen.append(gc.isenabled()))
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        tl.trace(model, torch.rand(2, 3))
        assert gc.isenabled() is enabled and seen == [False]  # paused during the forward only
        with pytest.raises(RuntimeError):
            tl.trace(nn.Sequential(Boom()), torch.rand(2, 3))
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


class Boom(nn.Module):
    def forward(self, x):
        raise RuntimeError("boom")


def test_a_traces_objects_are_built_on_first_read_from_what_the_capture_saw():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    trace = tl.trace(model, torch.rand(2, 3), save=None)
    assert trace._pending is not None and len(trace) == 4  # counted without building
    model.half()  # a model changed after the capture does not change its trace
    assert trace.params["0.weight"]["dtype"] == "float32" and trace["linear_1"].dtype == "float32"
    assert trace._pending is None


@pytest.mark.parametrize("save", [None, "all"])
def test_a_capture_leaves_the_collector_few_objects_per_op(save):
    """What a capture keeps is scanned by the collector's next young pass, so it keeps little
    per op and per module call: a single parent as an index, equal parameter facts once, a saved
    value's storage known by address, a module call's facts on its frame (the previous layout
    left over 6 objects per op and call here)."""
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(100)]).eval()
    x = torch.randn(1, 8)
    with torch.no_grad():
        tl.trace(model, x, save=save)
        gc.collect()
        gc.disable()
        try:
            trace = tl.trace(model, x, save=save)
            young = len(gc.get_objects(generation=0))
        finally:
            gc.enable()
    calls = sum(len(m.calls) for m in trace.modules.values())
    assert young <= 4.5 * (len(trace) + calls), f"{young} objects, {len(trace)} ops, {calls} calls"
