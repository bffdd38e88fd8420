"""The per-op number a drawing is coloured by: a diff's relative difference, each op's
gradient norm (``color="grad_norm"``), or the caller's own (``overlay=``). A module call shows
the largest of its ops'."""

from __future__ import annotations

import math
from typing import Any

from .options import refuse

NAMES = {"diff": "relative difference", "grad_norm": "gradient norm"}


def op_metrics(trace: Any, opts: Any) -> tuple[str, dict[str, float]] | None:
    """(legend name, {op label: value}) for the drawing, or None when it is not coloured."""
    if opts.color == "grad_norm":
        return NAMES["grad_norm"], _grad_norms(trace)
    if opts.overlay is not None:  # color= names the caller's numbers ("attribution score")
        return opts.color, _overlay(trace, opts.overlay)
    if trace.meta.get("diff"):
        return NAMES["diff"], {op.label: op.meta["diff"]["relative"] for op in trace.ops
                               if op.meta["diff"]["relative"] is not None}
    return None


def _grad_norms(trace: Any) -> dict[str, float]:
    from ..errors import grads_unavailable
    from ..trace import NO_GRAD

    out = {}
    for op in trace.ops:
        grad = op._grad
        if grad is None or grad is NO_GRAD:
            continue
        parts = grad if isinstance(grad, tuple) else (grad,)
        out[op.label] = math.sqrt(sum(float(g.detach().double().square().sum()) for g in parts))
    if not out:
        raise grads_unavailable('color="grad_norm" on a trace with no gradients',
                                teach=['trace = tl.trace(model, x, save_grads="all")',
                                 "trace.backward(target); trace.draw(color='grad_norm')"])
    return out


def _overlay(trace: Any, overlay: Any) -> dict[str, float]:
    if callable(overlay):
        out = {}
        for op in trace.ops:
            value = overlay(op)
            if value is not None:
                out[op.label] = float(value)
        return out
    out = {}
    for label, value in overlay:
        try:
            op = trace[label]
        except KeyError:
            op = None
        if op is None or not hasattr(op, "base_label"):
            import difflib

            close = difflib.get_close_matches(label, [o.label for o in trace.ops], n=3)
            raise refuse(f"overlay= names {label!r}, which is no op label of this trace",
                         [f"overlay={{{c!r}: ...}}" for c in close] + ["[op.label for op in "
                                                                      "trace]"])
        out[op.label] = float(value)
    return out


def largest(values: dict[str, float], labels: list[str]) -> float | None:
    """The value of largest magnitude among ``labels`` (None: none of them has one)."""
    found = [values[label] for label in labels if label in values]
    return max(found, key=abs) if found else None
