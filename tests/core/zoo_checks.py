"""Checks every zoo case must pass: output equality, stable labels, saved module outputs, saved
values against an independent reference, the light capture."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

import torchlens as tl
from tests.models import ZooCase, call_model

# A plain eval/no-grad call of these runs one fused kernel per layer; any module hook or torch
# function mode (so any capture) turns that fast path off, and the decomposed ops round differently.
FUSED_WHEN_PLAIN = {"transformer_encoder"}


def _flat(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict) or hasattr(value, "values") and callable(value.values):
        return [t for v in value.values() for t in _flat(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return []


def check_output_equals_plain_forward(case: ZooCase) -> None:
    model, x = case.build()
    torch.manual_seed(7)
    with torch.no_grad():
        expected = _flat(call_model(model, x))
    model, x = case.build()
    torch.manual_seed(7)
    with torch.no_grad():
        trace = tl.trace(model, x)
    got = _flat(trace.output)
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        if case.name in FUSED_WHEN_PLAIN:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        else:
            assert torch.equal(a, b)
    assert [op.out.shape for op in trace.outputs] == [t.shape for t in expected]


def check_labels_stable(case: ZooCase) -> None:
    model, x = case.build()
    torch.manual_seed(3)
    first = tl.trace(model, x, save=None)
    torch.manual_seed(3)
    second = tl.trace(model, x, save=None)
    assert [op.label for op in first] == [op.label for op in second]
    assert [op.parents for op in first] == [op.parents for op in second]
    assert len({op.label for op in first}) == len(first)


def check_module_outputs_saved(case: ZooCase) -> None:
    model, x = case.build()
    seen: dict[str, list[torch.Tensor]] = {}
    modules = dict(model.named_modules())
    handles = [
        modules[address].register_forward_hook(
            lambda m, a, out, address=address: seen.setdefault(address, []).append(
                out.detach().clone()))
        for address in case.module_outputs
    ]
    torch.manual_seed(5)
    try:
        trace = tl.trace(model, x)
    finally:
        for h in handles:
            h.remove()
    for address in case.module_outputs:
        module = trace[address]
        assert len(module.calls) == len(seen[address])
        for call, expected in zip(module.calls, seen[address]):
            op = trace[call.output_ops[0]]
            assert f"{address}:{call.pass_num}" in op.module_outputs
            assert torch.equal(call.out, expected)
            assert torch.equal(op.out, expected)


class _CloneEveryOutput(TorchFunctionMode):
    """An independent reference: a copy of every top-level torch call's tensor outputs (for
    ``__setitem__``, of the tensor it wrote), taken the moment the call returns."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[str, list[torch.Tensor]]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        written = [args[0]] if func is torch.Tensor.__setitem__ else _flat(out)
        if written:
            self.rows.append((func.__name__, [t.detach().clone() for t in written]))
        return out


def check_saved_values_equal_a_reference(case: ZooCase) -> None:
    """``save="all"`` keeps, for every op, exactly what the call returned when it ran, though
    values are kept by reference until something writes to them: a mode of its own that copies
    every output at once sees the same values (``empty`` ops, whose bytes are whatever memory
    held, excepted)."""
    model, x = case.build()
    reference = _CloneEveryOutput()
    torch.manual_seed(11)
    with torch.no_grad(), reference:
        call_model(model, x)
    model, x = case.build()
    torch.manual_seed(11)
    with torch.no_grad():
        trace = tl.trace(model, x, save="all")
    ops = [op for op in trace if op.kind == "op"]
    assert len(ops) == len(reference.rows) > 0
    for op, (name, expected) in zip(ops, reference.rows):
        assert op.saved, op.label
        got = _flat(op.out)
        assert len(got) == len(expected), (op.label, name)
        if op.func.startswith(("empty", "new_empty")):
            continue
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), op.label


def check_light_capture_matches_trace(case: ZooCase) -> None:
    """``tl.record``'s light capture labels and keeps exactly what a full trace does: every
    third op label, picked across function names, gives the trace's values."""
    from torchlens.capture.engine import capture
    from torchlens.capture.seam import CaptureRequest
    from torchlens.capture.taps import Taps

    model, x = case.build()
    torch.manual_seed(9)
    with torch.no_grad():
        trace = tl.trace(model, x)
    picked = [op.label for op in trace if op.kind == "op"][::3]
    args, kwargs = (((), x) if isinstance(x, dict) else ((x if isinstance(x, tuple) else (x,)), {}))
    model, _ = case.build()
    torch.manual_seed(9)
    with torch.no_grad():
        taps = Taps()
        light = capture(CaptureRequest(model, args, kwargs, save=picked), [taps])
        kept = taps.values
    assert len(light) == 0 and light.meta["light"]  # a light capture's Trace holds no ops
    assert set(picked) <= set(kept)  # a first-pass label also selects the later passes
    assert all(label in picked or label.partition(":")[0] in picked for label in kept)
    for label in kept:
        a, b = _flat(kept[label]), _flat(trace[label].out)
        assert len(a) == len(b) and all(torch.equal(u, v) for u, v in zip(a, b)), label
