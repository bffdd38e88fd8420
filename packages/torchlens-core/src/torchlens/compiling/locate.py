"""Where each selected op runs: its function's name and its count among that function's calls
in the forward (``add``, 11th call), found by one eager capture of the same input signature.

A compiled forward makes the same torch calls in the same order (dynamo traces the torch
function mode that counts them), so the count places a label in the compiled graph; the first
compiled forward is compared with this capture's values, so a count that drifted refuses.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..capture.entry import pinned_capture
from ..capture.naming import NAMES, func_name
from ..capture.seam import Part
from ..sites import function_of, name_of

ENDS = re.compile(r"(input|output)_\d+")  # the forward's input and output tensors' labels


@dataclass(frozen=True)
class Place:
    """One op call of the forward: ``name``'s ``ordinal``-th call, in module ``address``."""

    label: str
    name: str
    ordinal: int
    address: str
    pass_num: int


@dataclass
class Located:
    """Where the labels run (``places``: label -> Place, every pass), which callables count
    (``funcs``: callable -> name), and the eager capture that found them (``trace``, with the
    selected values) — ``fresh`` when it was captured for this call, not reused."""

    places: dict[str, Place]
    funcs: dict[Any, str]
    trace: Any
    fresh: bool = True


class _Locate(TorchFunctionMode, Part):
    """A leading part: counts each call of the wanted functions' names before the recorder
    records it, and notes the count of every call of a wanted base label."""

    def __init__(self, bases: set[str]):
        super().__init__()
        self.ops = set(bases)
        self.names = {function_of(b) for b in bases}
        self.counts: dict[str, int] = {}
        self.funcs: dict[Any, str] = {}
        self.places: dict[str, Place] = {}
        self.current: tuple[str, int] | None = None

    def lead(self, recorder: Any, session: Any) -> Any:
        self.recorder = recorder
        return self

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = NAMES.get(func) or func_name(func)
        if name in self.names:
            self.funcs[func] = name
            n = self.counts[name] = self.counts.get(name, 0) + 1
            self.current = (name, n)
        return self.recorder.__torch_function__(func, types, args, kwargs)

    def op(self, out: Any, label: str, base: str, pass_num: int, frame: Any, func: str,
           args: tuple, kwargs: dict, index: int | None, inplace: bool) -> Any:
        if self.current is not None and self.current[0] == func:
            self.places[label] = Place(label, func, self.current[1], frame[0], pass_num)
        return out


_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _signature(args: tuple, kwargs: dict) -> tuple:
    return tuple((k, tuple(v.shape), v.dtype, v.device) if isinstance(v, Tensor) else
                 (k, repr(v)) for k, v in [*enumerate(args), *sorted(kwargs.items())])


def locate(model: nn.Module, args: tuple, kwargs: dict, save: list[str], bases: set[str],
           parts: list, surface: str, reuse: bool = True) -> Located:
    """Place ``bases`` (base op labels: the saved ones, and those other parts edit or read)
    with one pinned eager capture saving ``save`` (with ``parts`` taking part, so its values
    are what the compiled forward must make). Kept per model, input signature and selection;
    with ``reuse``, a kept one is returned (not ``fresh``: its values are another input's)."""
    per_model = _cache.setdefault(model, {})
    cache_key = (_signature(args, kwargs), tuple(save), tuple(sorted(bases)),
                 repr([p.specs() for p in parts if hasattr(p, "specs")]))
    found = per_model.get(cache_key) if reuse else None
    if found is not None:
        return Located(found.places, found.funcs, found.trace, fresh=False)
    finder = _Locate(bases)
    with torch.no_grad():
        trace = pinned_capture(model, args, kwargs, save=save or None, surface=surface,
                               parts=[*parts, finder])
    located = per_model[cache_key] = Located(finder.places, finder.funcs, trace)
    return located


def wanted(located: Located, bases: set[str]) -> dict[tuple[str, int], Place]:
    """The places of ``bases``' calls, by (name, count): what the compiled forward taps."""
    return {(p.name, p.ordinal): p for p in located.places.values() if name_of(p.label) in bases}
