"""One surface call's compiled forwards: the compiler, the sites placed on the first forward's
input, the first forward checked against the eager capture, and what to report of it all."""

from __future__ import annotations

import time
from typing import Any

from torch import nn

from ..capture.engine import parse_save
from ..capture.inventory import Inventory
from ..capture.seam import EVERY_OP
from ..errors import InputError, surface_call
from ..sites import name_of
from .compiler import Compiler
from .locate import ENDS, Located, locate
from .taps import CompiledStructure, CompiledTaps
from .verify import differences


class CompiledRun:
    """``model`` compiled with ``options`` for one call of ``surface``: ``part(...)`` gives
    each forward's runner; ``checked(part)`` compares the first with the eager capture."""

    def __init__(self, model: nn.Module, options: dict, surface: str, inv: Inventory):
        self.model, self.surface, self.inv = model, surface, inv
        self.compiler = Compiler(options)
        self.located: Located | None = None
        self.diffs: dict[str, float | None] = {}
        self.place_s = 0.0  # the eager capture that placed the sites
        self._check = False
        self._sites: list[str] = []

    def part(self, args: tuple, kwargs: dict, save: list[str], parts: list,
             structure: bool = False) -> CompiledTaps:
        """The runner of one forward saving ``save`` (op labels, module addresses), with
        ``parts`` (edits, names) taking part; the first one places the sites. ``structure``:
        its capture's Trace is the eager graph with the compiled values."""
        _, labels, modules = parse_save(save, self.model, self.inv, self.surface)
        labels = {label for label in labels if not ENDS.fullmatch(label)}
        if self.located is None:
            if any(p.ops is EVERY_OP for p in parts):
                raise InputError(f"compile=: a part of this {self.surface} reads every op, which "
                                 "a compiled graph does not expose", code="site_not_compilable",
                                 teach=[surface_call(self.surface, "compile=False")])
            bases = {name_of(label) for label in labels}
            for p in parts:
                bases |= set(p.ops)
            t0 = time.perf_counter()
            self.located = locate(self.model, args, kwargs, sorted(labels | modules), bases,
                                  parts, self.surface, reuse=self.surface == "trace")
            self.place_s = time.perf_counter() - t0
            self._check = self.located.fresh
            self._sites = sorted(labels | modules)
        kind = CompiledStructure if structure else CompiledTaps
        return kind(self.compiler, self.located, sorted(labels), sorted(modules))

    def checked(self, part: CompiledTaps) -> None:
        """After the first forward: its values against the eager capture's (refuses a site
        the compiled graph gave otherwise)."""
        if not self._check:
            return
        self._check = False
        training = any(m.training for m in self.model.modules())
        placed = {name_of(k) for k in self.located.places} | {
            k for k in self._sites if k in dict(self.inv.modules)}
        self.diffs = differences(part.raw, self.located,
                                 [s for s in self._sites if name_of(s) in placed
                                  or s in placed], training, self.surface)

    def describe(self) -> dict[str, Any]:
        """The compiling's facts and each site's largest difference from eager."""
        return {**self.compiler.describe(), "place_s": round(self.place_s, 3),
                "max_abs_diff": self.diffs}

    def close(self) -> None:
        self.compiler.close()
