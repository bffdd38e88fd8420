"""How far apart two values of one op are: max absolute and relative difference, cosine
similarity and the fraction of elements outside a tolerance. Reference: the first trace."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

STAT_KEYS = ("max_abs", "relative", "cosine", "outside")
# ops whose output holds exactly its one input's elements, rearranged: the four numbers are
# those of the input (they do not depend on the order of the elements)
REARRANGE = frozenset({
    "view", "reshape", "transpose", "permute", "contiguous", "flatten", "unflatten", "t",
    "unsqueeze", "squeeze", "movedim", "moveaxis", "swapaxes", "swapdims", "clone", "detach",
    "view_as", "reshape_as", "transpose_", "t_", "unsqueeze_", "squeeze_", "output"})


def tensors(value: Any) -> list[Tensor] | None:
    """The tensors of an op's value (an op may return several); None when there is none."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, Tensor) for v in value):
        return list(value)
    return None


def _real(t: Tensor) -> Tensor:
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.float64:
        return t.detach()
    return t.detach().to(torch.float32)


def value_stats(a: Any, b: Any, atol: float, rtol: float) -> dict[str, float] | str:
    """The four numbers of ``a`` against ``b``, or why they cannot be compared (a string)."""
    ta, tb = tensors(a), tensors(b)
    if ta is None or tb is None:
        return "no tensor value"
    if len(ta) != len(tb) or any(x.shape != y.shape for x, y in zip(ta, tb)):
        return "shapes differ"
    if any(x.is_meta or y.is_meta for x, y in zip(ta, tb)):
        return "meta tensors hold no values"
    if all(x is y for x, y in zip(ta, tb)):
        return {"max_abs": 0.0, "relative": 0.0, "cosine": 1.0, "outside": 0.0}
    max_abs = dot = na = nb = nd = 0.0
    outside = total = 0
    for x, y in zip(ta, tb):
        if x.device != y.device:
            y = y.to(x.device)
        x, y = _real(x), _real(y)
        if x.dtype != y.dtype:
            x, y = x.double(), y.double()
        if x.numel() == 0:
            continue
        x, y = x.reshape(-1), y.reshape(-1)
        d = y - x
        # one pass for the extremes, dot products for the norms: few passes, few temporaries
        low, high = (v.item() for v in torch.aminmax(d))
        m = max(-low, high) if not (math.isnan(low) or math.isnan(high)) else math.nan
        xy, xx, yy, dd = (torch.dot(x, y).item(), torch.dot(x, x).item(),
                          torch.dot(y, y).item(), torch.dot(d, d).item())
        if m > atol:  # only then can an element be outside atol + rtol * |x|
            outside += int(torch.add(d.abs(), x.abs(), alpha=-rtol).gt_(atol).sum().item())
        elif math.isnan(m):
            outside += int(torch.add(d.abs(), x.abs(), alpha=-rtol).gt_(atol).sum().item()
                           + d.isnan().sum().item())
        max_abs = max(max_abs, m) if not math.isnan(m) else math.nan
        dot, na, nb, nd = dot + xy, na + xx, nb + yy, nd + dd
        total += x.numel()
    na, nb, nd = math.sqrt(na), math.sqrt(nb), math.sqrt(nd)
    relative = nd / na if na else (0.0 if nd == 0 else math.inf)
    cosine = dot / (na * nb) if na and nb else (1.0 if na == nb else 0.0)
    return {"max_abs": max_abs, "relative": relative, "cosine": cosine,
            "outside": outside / total if total else 0.0}


def within(a: Any, b: Any, atol: float, rtol: float) -> bool:
    """Every element of ``a`` and ``b`` within ``atol + rtol * |a|`` of each other."""
    stats = value_stats(a, b, atol, rtol)
    return not isinstance(stats, str) and stats["outside"] == 0.0
