"""The Comparison of two traces: matched ops with their differences, the first op that
introduced a difference, the largest ones, parameters, and the table, frame and drawings."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from ..errors import TorchLensError, pandas_for
from ..units import format_shape
from .match import match_ops
from .metrics import REARRANGE, STAT_KEYS, value_stats, within
from .table import TopRows
from .union import union_trace

ATOL, RTOL = 1e-5, 1.3e-6  # torch.testing's float32 tolerances
BY = {"relative": True, "max_abs": True, "outside": True, "cosine": False}  # larger is worse?
VALUES_TEACH = ['tl.trace(model, x, save="all")  # every value, on both sides',
                'tl.trace(model, x, save=["transformer.h.*"])  # or the sites to compare']


@dataclass
class DiffRow:
    """One op of the comparison.

    status: "matched" (in both runs, same function, shape and dtype), "changed" (in both, and
    ``changes`` says what changed), "added" (in b only) or "removed" (in a only).
    values: "compared" (the four numbers are set), "not saved", or why they were not compared.
    max_abs / relative / cosine / outside: of b's value against a's (relative: norm of the
    difference over the norm of a's value; outside: fraction of elements beyond the tolerance).
    """

    a: str | None
    b: str | None
    status: str
    func: str
    module: str
    changes: list[str] = field(default_factory=list)
    shape_a: str = ""
    shape_b: str = ""
    dtype_a: str = ""
    dtype_b: str = ""
    values: str = "not saved"
    max_abs: float | None = None
    relative: float | None = None
    cosine: float | None = None
    outside: float | None = None
    flops_a: int | None = None
    flops_b: int | None = None
    time_ns_a: int = 0
    time_ns_b: int = 0

    @property
    def label(self) -> str:
        """The op's label in b, or in a for an op b does not have."""
        return self.b if self.b is not None else self.a  # type: ignore[return-value]

    @property
    def differs(self) -> bool:
        """Its values differ beyond the comparison's tolerance."""
        return bool(self.outside)

    def row(self) -> dict[str, Any]:
        """This row as a plain dict (what ``to_pandas`` holds)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    def where(self) -> str:
        """``linear_3 in transformer.h.0.mlp`` (or ``a:x → b:y`` when the labels differ)."""
        label = self.label if self.a in (None, self.b) or self.b is None else \
            f"{self.a} → {self.b}"
        return f"{label} in {self.module or '<model>'}"

    def numbers(self) -> str:
        """``relative 2.1e-03, max abs 0.012, cosine 0.99998``, or why there are none."""
        if self.values != "compared":
            return self.values
        return (f"relative {self.relative:.3g}, max abs {self.max_abs:.3g}, "
                f"cosine {self.cosine:.6g}, {100 * self.outside:.3g}% outside")


class Comparison:
    """Two traces op by op (``tl.compare(a, b)``). ``rows``: every op once, in graph order."""

    def __init__(self, a: Any, b: Any, *, atol: float = ATOL, rtol: float = RTOL,
                 names: tuple[str, str] = ("a", "b")):
        self.a, self.b, self.atol, self.rtol, self.names = a, b, atol, rtol, names
        ops_a, ops_b = a.ops, b.ops
        self._pairs = match_ops(ops_a, ops_b)
        self.rows: list[DiffRow] = []
        self._by_a: dict[str, DiffRow] = {}
        self._by_b: dict[str, DiffRow] = {}
        for i, j in self._pairs:
            row = self._row(ops_a[i] if i is not None else None,
                            ops_b[j] if j is not None else None)
            self.rows.append(row)
            if row.a is not None:
                self._by_a[row.a] = row
            if row.b is not None:
                self._by_b[row.b] = row

    def _row(self, x: Any, y: Any) -> DiffRow:
        op = y if y is not None else x
        if x is None or y is None:
            return DiffRow(
                x.label if x else None, y.label if y else None, "removed" if y is None else
                "added", op.func, op.module, shape_a=format_shape(x.shape) if x else "",
                shape_b=format_shape(y.shape) if y else "", dtype_a=x.dtype or "" if x else "",
                dtype_b=y.dtype or "" if y else "", values="on one side only",
                flops_a=x.flops if x else None, flops_b=y.flops if y else None,
                time_ns_a=x.time_ns if x else 0, time_ns_b=y.time_ns if y else 0)
        changes = []
        if x.func != y.func:
            changes.append(f"function {x.func} → {y.func}")
        if x.out_shapes != y.out_shapes:
            changes.append(f"shape {format_shape(x.shape)} → {format_shape(y.shape)}")
        if x.dtype != y.dtype:
            changes.append(f"dtype {x.dtype} → {y.dtype}")
        row = DiffRow(x.label, y.label, "changed" if changes else "matched", y.func, y.module,
                      changes, format_shape(x.shape), format_shape(y.shape), x.dtype or "",
                      y.dtype or "", flops_a=x.flops, flops_b=y.flops, time_ns_a=x.time_ns,
                      time_ns_b=y.time_ns)
        if x.saved and y.saved:
            source = self._rearranged(x, y)
            stats = {k: getattr(source, k) for k in STAT_KEYS} if source else \
                value_stats(x._value, y._value, self.atol, self.rtol)
            if isinstance(stats, str):
                row.values = stats
            else:
                row.values = "compared"
                for key in STAT_KEYS:
                    setattr(row, key, stats[key])
        elif x.saved or y.saved:
            row.values = f"not saved in {self.names[0] if not x.saved else self.names[1]}"
        return row

    def _rearranged(self, x: Any, y: Any) -> DiffRow | None:
        """The compared row of the one input ``x`` and ``y`` both rearrange (a view, a
        transpose, the output node), whose numbers are theirs; None otherwise."""
        if x.func not in REARRANGE or y.func != x.func or len(x.parents) != 1 or \
                len(y.parents) != 1 or x.shape is None:
            return None
        source = self._by_a.get(x.parents[0])
        if source is None or source.b != y.parents[0] or source.values != "compared":
            return None
        px = self.a[source.a]
        if isinstance(px._value, tuple) or px.shape is None or \
                math.prod(px.shape) != math.prod(x.shape):
            return None
        return source

    # ---- counts ------------------------------------------------------------------------------
    def _count(self, status: str) -> int:
        return sum(r.status == status for r in self.rows)

    @property
    def compared(self) -> int:
        """How many ops had values on both sides to compare."""
        return sum(r.values == "compared" for r in self.rows)

    @property
    def equal(self) -> bool:
        """The same ops, and every compared value within the tolerance."""
        return all(r.status == "matched" and not r.differs for r in self.rows)

    # ---- questions ---------------------------------------------------------------------------
    def _tolerance(self, atol: float | None, rtol: float | None) -> tuple[float, float]:
        atol = self.atol if atol is None else atol
        rtol = self.rtol if rtol is None else rtol
        if not (atol >= 0 and rtol >= 0):
            raise TorchLensError(f"atol={atol!r} and rtol={rtol!r} must be >= 0",
                                 code="option_invalid", teach=["cmp.first_divergence(atol=1e-4)"])
        return atol, rtol

    def _differs(self, row: DiffRow, atol: float, rtol: float) -> bool | None:
        """Whether ``row``'s values differ beyond the tolerance; None when not compared."""
        if row.values != "compared":
            return None
        if (atol, rtol) == (self.atol, self.rtol):
            return row.differs
        return not within(self.a[row.a]._value, self.b[row.b]._value, atol, rtol)

    def differing(self, atol: float | None = None, rtol: float | None = None) -> list[DiffRow]:
        """The ops whose values differ beyond the tolerance, in graph order."""
        atol, rtol = self._tolerance(atol, rtol)
        return [r for r in self.rows if self._differs(r, atol, rtol)]

    def first_divergence(self, atol: float | None = None, rtol: float | None = None
                         ) -> DiffRow | None:
        """The earliest op whose values differ beyond the tolerance while all its inputs agree
        within it: the op that introduced the difference, not one that inherited it. An input
        without a saved value stands for its own inputs; an op on one side only counts as a
        difference. None when nothing differs (or no values were saved: see ``compared``)."""
        atol, rtol = self._tolerance(atol, rtol)
        state: dict[int, bool | None] = {}  # id(row) -> differs (None: not compared)
        upstream: dict[int, bool] = {}

        def differs_above(row: DiffRow) -> bool:
            """Some value this row reads differs (looking through values not saved)."""
            key = id(row)
            if key in upstream:
                return upstream[key]
            upstream[key] = False  # cycles cannot happen; guard anyway
            found = False
            for parent in self._parents(row):
                mark = state.get(id(parent))
                if parent.status in ("added", "removed") or mark:
                    found = True
                elif mark is None and differs_above(parent):
                    found = True
                if found:
                    break
            upstream[key] = found
            return found

        for row in self.rows:
            state[id(row)] = self._differs(row, atol, rtol)
        for row in self.rows:
            if state[id(row)] and not differs_above(row):
                return row
        return None

    def _parents(self, row: DiffRow) -> list[DiffRow]:
        out = []
        if row.a is not None:
            out += [self._by_a[p] for p in self.a[row.a].parents or () if p in self._by_a]
        if row.b is not None:
            out += [self._by_b[p] for p in self.b[row.b].parents or () if p in self._by_b]
        return out

    def top(self, k: int = 10, by: str = "relative") -> TopRows:
        """The ``k`` compared ops that differ most ``by`` "relative", "max_abs", "outside" or
        "cosine" (lowest first), largest first; ties keep graph order. A list of ``DiffRow``
        that prints as a table (label, function, module, shape and the four numbers) and has
        ``to_pandas()``."""
        if by not in BY:
            raise TorchLensError(f"by={by!r} is not one of {sorted(BY)}", code="option_invalid",
                                 teach=[f'cmp.top({k}, by="{name}")' for name in BY])
        rows = [r for r in self.rows if r.values == "compared" and (
            getattr(r, by) > 0 if BY[by] else getattr(r, by) < 1)]
        sign = -1 if BY[by] else 1
        rows.sort(key=lambda r: sign * (getattr(r, by) if not math.isnan(getattr(r, by))
                                        else -sign * math.inf))
        return TopRows(rows[:k], by, self.compared)

    @property
    def params(self) -> list[dict[str, Any]]:
        """Per module that holds parameters: "same tensors", "equal", "differ" (with the max
        absolute and relative difference), "shapes differ", or on one side only. Compared when
        both traces hold their live model (a trace from a file holds none: empty)."""
        from .params import compare_params

        return compare_params(self.a, self.b)

    # ---- surfaces ----------------------------------------------------------------------------
    def __repr__(self) -> str:
        first = self.first_divergence()
        return (f"<Comparison {self._title()}: {len(self.rows)} ops, "
                f"{self._count('matched') + self._count('changed')} matched, "
                f"{self._count('added')} added, {self._count('removed')} removed, "
                f"{len(self.differing())} differ, first divergence "
                f"{first.label if first else None}>")

    def _title(self) -> str:
        a, b = (t.meta.get("model_class", "model") for t in (self.a, self.b))
        return f"{self.names[0]} ({a}) vs {self.names[1]} ({b})"

    def __str__(self) -> str:
        from .table import text

        return text(self)

    def to_pandas(self):
        """One pandas row per op (every field of ``DiffRow``)."""
        pandas = pandas_for("cmp.to_pandas()", "cmp.rows  # the same, as objects")
        return pandas.DataFrame([r.row() for r in self.rows])

    def draw(self, *, path: str | os.PathLike | None = None, collapse: str | int = "none",
             **dials: Any):
        """The diff drawing: b's graph with a's ops that b lacks, each op coloured by its
        relative difference, added and removed ops marked, module groups showing their largest
        difference. ``path="diff.html"`` writes the interactive viewer in diff mode;
        ``path="diff.svg"`` (or .pdf, .png) the static drawing. Other dials as ``Trace.draw``."""
        return union_trace(self).draw(path=path, collapse=collapse, **dials)
