"""Ops inside functorch transforms (``torch.vmap``, ``torch.func.grad``): the real tensors.

Inside a transform an op sees wrappers: ``vmap``'s batched tensors show one example's shape,
and they are new objects that die when the transform returns. A trace records the real tensor
under them instead, with the vmapped dimensions in front, outermost transform first: the shape
and values ``vmap(..., out_dims=0)`` would return. When the transform returns, its result is
that real tensor (or a view of it), which is how the ops after it find their parent.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C import _functorch as _ft

is_wrapped = _ft.is_functorch_wrapped_tensor
inside = _ft.maybe_current_level  # None outside every transform


def unwrapped(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """(the real tensor under ``t``'s wrappers, the permutation of its dimensions that puts the
    vmapped ones first, the levels of those, outermost first)."""
    bdims = []  # (level, batch dim among the next wrapper's dims), innermost level first
    while is_wrapped(t):
        if _ft.is_batchedtensor(t):
            bdims.append((_ft.maybe_get_level(t), _ft.maybe_get_bdim(t)))
        t = _ft.get_unwrapped(t)
    rest = list(range(t.dim()))
    front = [rest.pop(bdim) for _, bdim in reversed(bdims)]  # each indexes what is left
    return t, tuple(front + rest), tuple(level for level, _ in reversed(bdims))


def in_front(real: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """``real`` with its dimensions in ``order`` (itself when that is its own order)."""
    if order == tuple(range(real.dim())):
        return real
    with torch._C.DisableTorchFunction():
        return real.permute(order)


class Batched:
    """A replayed argument that was a batched tensor: its value (vmapped dimensions first) and
    the levels they belong to."""

    __slots__ = ("value", "levels")

    def __init__(self, value: torch.Tensor, levels: tuple[int, ...]):
        self.value, self.levels = value, levels


def call_batched(func: Any, args: Any, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` where arguments may be ``Batched``: run under one ``vmap`` per
    level (outermost first, each taking the front dimension of what it batches), so the result
    has the vmapped dimensions first, as the recorded value does. A call that writes its first
    argument and returns None gives that argument."""
    found: list[Batched] = []

    def swap(value: Any, depth: int = 0) -> Any:
        if isinstance(value, Batched):
            found.append(value)
            return _Slot(len(found) - 1)
        if isinstance(value, (tuple, list)) and depth < 3:
            return type(value)(swap(v, depth + 1) for v in value)
        if isinstance(value, dict) and depth < 3:
            return {k: swap(v, depth + 1) for k, v in value.items()}
        return value

    args, kwargs = swap(args), swap(kwargs)
    if not found:
        return _written(func(*args, **kwargs), args)

    def fill(value: Any, given: tuple) -> Any:
        if isinstance(value, _Slot):
            return given[value.i]
        if isinstance(value, (tuple, list)):
            return type(value)(fill(v, given) for v in value)
        if isinstance(value, dict):
            return {k: fill(v, given) for k, v in value.items()}
        return value

    def run(*given):
        filled = fill(args, given)
        return _written(func(*filled, **fill(kwargs, given)), filled)

    levels = sorted({level for b in found for level in b.levels})
    for level in reversed(levels):  # the innermost vmap wraps the call first
        run = torch.vmap(run, in_dims=tuple(0 if level in b.levels else None for b in found))
    return run(*(b.value for b in found))


def _written(out: Any, args: Any) -> Any:
    """A call's result; for ``__setitem__`` (or ``t.data = v``), which returns None, the first
    argument it wrote."""
    return args[0] if out is None and args else out


class _Slot:
    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i
