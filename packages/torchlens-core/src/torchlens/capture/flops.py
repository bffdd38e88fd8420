"""FLOPs of the few torch-level calls with a known formula, reusing torch.utils.flop_counter.

The formulas are torch's own (per aten op); this module only maps a torch-level call's shapes onto
them. Anything else is ``None``: unknown, never invented. During the forward only the shapes are
taken (``shapes``), or, when the call's weight is a parameter (``WEIGHT_ARG``), only that
parameter's name: its shape is among the parameters' facts and the output's shape is recorded,
so nothing is kept per call. The count is made afterwards (``flops_of``, ``flops_of_weight``).
"""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from typing import Any

import torch
from torch.utils import flop_counter as fc


def _raw(formula: Callable) -> Callable:
    """torch registers its formulas behind a pytree shape wrapper (~40 us a call, and a
    reference cycle left for the collector); we already pass shapes, so call the formula
    itself."""
    return getattr(formula, "__wrapped__", formula)


# torch's addmm/baddbmm formulas call the *wrapped* mm/bmm ones; they are those plus nothing
# (the bias add is not counted), so the raw mm/bmm formulas serve them directly.
MM, BMM = _raw(fc.mm_flop), _raw(fc.bmm_flop)


def _shape(t: Any) -> list[int] | None:
    return list(t) if isinstance(t, torch.Size) else None


def shapes(kwargs: dict) -> dict:
    """Keyword arguments with every tensor replaced by its shape (nothing kept alive); the
    recorder does the same for positional ones inline."""
    return {k: v.shape if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}


def _arg(args, kwargs, i, name):
    return args[i] if len(args) > i else kwargs.get(name)


def _linear(args, kwargs, out):
    x, w = _shape(_arg(args, kwargs, 0, "input")), _shape(_arg(args, kwargs, 1, "weight"))
    if x is None or w is None or len(w) != 2:
        return None
    return MM([prod(x[:-1]), x[-1]], [w[1], w[0]])


def _conv(transposed: bool):
    def formula(args, kwargs, out):
        x, w = _shape(_arg(args, kwargs, 0, "input")), _shape(_arg(args, kwargs, 1, "weight"))
        if x is None or w is None:
            return None
        return fc.conv_flop_count(x, w, list(out), transposed=transposed)

    return formula


def _matmul(args, kwargs, out):
    a, b = _shape(_arg(args, kwargs, 0, "input")), _shape(_arg(args, kwargs, 1, "other"))
    if a is None or b is None:
        return None
    a = a if len(a) > 1 else [1] + a
    b = b if len(b) > 1 else b + [1]
    batch = prod(out[:-2]) if len(out) > 2 else 1
    return BMM([batch, a[-2], a[-1]], [batch, b[-2], b[-1]])


def _addmm(args, kwargs, out):
    a, b = _shape(_arg(args, kwargs, 1, "mat1")), _shape(_arg(args, kwargs, 2, "mat2"))
    return MM(a, b) if a and b else None


def _baddbmm(args, kwargs, out):
    a, b = _shape(_arg(args, kwargs, 1, "batch1")), _shape(_arg(args, kwargs, 2, "batch2"))
    return BMM(a, b) if a and b else None


def _sdpa(args, kwargs, out):
    q, k, v = (_shape(_arg(args, kwargs, i, n)) for i, n in enumerate(("query", "key", "value")))
    if q is None or k is None or v is None:
        return None
    (b, s_q, d_q), (b_k, s_k, d_k), (b_v, s_v, d_v) = (
        (prod(s[:-2]) if len(s) > 2 else 1, *s[-2:]) for s in (q, k, v))
    if not (b == b_k == b_v and d_q == d_k and s_k == s_v):
        return None
    # torch's sdpa_flop_count, on the raw bmm formula (its own calls the pytree-wrapped one):
    # scores = q @ k^T, then scores @ v
    return BMM([b, s_q, d_q], [b, d_q, s_k]) + BMM([b, s_q, s_k], [b, s_k, d_v])


# name -> formula(args, kwargs, out_shape), tensors in args/kwargs given as their torch.Size
FORMULAS: dict[str, Callable[[tuple, dict, Any], int | None]] = {
    "linear": _linear,
    "conv1d": _conv(False), "conv2d": _conv(False), "conv3d": _conv(False),
    "conv_transpose1d": _conv(True), "conv_transpose2d": _conv(True),
    "conv_transpose3d": _conv(True),
    "matmul": _matmul, "mm": _matmul, "bmm": _matmul,
    "addmm": _addmm, "baddbmm": _baddbmm,
    "scaled_dot_product_attention": _sdpa,
}


# name -> (position of the weight argument, the call's argument shapes rebuilt from the weight's
# and the output's), for calls whose FLOPs need no other shape (``flops_of_weight``)
WEIGHT_ARG: dict[str, tuple[int, Callable[[torch.Size, torch.Size], tuple]]] = {
    # input (..., in), weight (out, in) -> output (..., out)
    "linear": (1, lambda w, out: (torch.Size([*out[:-1], w[1]]), w)),
    # addmm(bias, mat1 (n, k), mat2 (k, m)) -> output (n, m)
    "addmm": (2, lambda w, out: (None, torch.Size([out[0], w[0]]), w)),
}


def flops_of_weight(name: str, weight: torch.Size | None, out: torch.Size) -> int | None:
    """FLOPs of a ``WEIGHT_ARG`` call from its weight's shape and its output's, by the same
    formula ``flops_of`` uses."""
    if weight is None or len(weight) != 2 or not out:
        return None
    return flops_of(name, WEIGHT_ARG[name][1](weight, out), {}, out)


def flops_of(name: str, args: tuple, kwargs: dict, out: torch.Size) -> int | None:
    """FLOPs for one call (given as ``shapes`` of its arguments and its output's shape), or None
    when no formula applies or the shapes do not fit it."""
    formula = FORMULAS.get(name)
    if formula is None:
        return None
    try:
        value = formula(args, kwargs, out)
        return None if value is None else int(value)
    except Exception:  # a shape the formula does not cover (or a nested tensor's): unknown
        return None
