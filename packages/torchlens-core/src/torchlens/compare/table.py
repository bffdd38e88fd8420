"""``print(cmp)``: the counts, the first divergence and the largest differences as text; the
``cmp.top(k)`` rows, which print as the same table."""

from __future__ import annotations

from typing import Any

from ..errors import pandas_for
from ..units import human

TOP = 10


def _num(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def _grid(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) if i < 4 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]


COLUMNS = ("label", "function", "module", "shape", "max abs", "relative", "cosine", "outside")


def _cells(r: Any) -> list[str]:
    return [r.label, r.func, r.module or "<model>", r.shape_b, _num(r.max_abs), _num(r.relative),
            _num(r.cosine, 6), f"{100 * r.outside:.3g}%"]


class TopRows(list):
    """``cmp.top(k)``: the ``DiffRow`` objects, largest difference first (index, slice and
    iterate it as a list), printed as one table; ``to_pandas()`` a frame of the same rows."""

    def __init__(self, rows: list, by: str = "relative", compared: int = 0):
        super().__init__(rows)
        self.by, self.compared = by, compared

    def lines(self, indent: str = "  ") -> list[str]:
        """The table's lines: a header, then one line per row (``print(cmp)`` indents them)."""
        return _grid([list(COLUMNS)] + [_cells(r) for r in self], indent)

    def __str__(self) -> str:
        if not self:
            return f"no compared op differs (by {self.by})"
        return "\n".join(self.lines(""))

    def __repr__(self) -> str:
        return (f"<top {len(self)} of {self.compared} compared ops, by {self.by}>\n"
                f"{self}")

    def _repr_html_(self) -> str:
        import html

        head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r))
                       + "</tr>" for r in self)
        return (f"<div><p><b>top {len(self)} of {self.compared} compared ops, by "
                f"{html.escape(self.by)}</b></p><table><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table></div>")

    def to_pandas(self):
        """One pandas row per op (every field of ``DiffRow``), largest difference first."""
        pandas = pandas_for("top.to_pandas()", "[r.row() for r in top]")
        return pandas.DataFrame([r.row() for r in self])


def text(cmp: Any) -> str:
    """The whole table of a Comparison."""
    na, nb = cmp.names
    count = cmp._count
    lines = [f"Comparison: {cmp._title()}",
             f"  ops: {na} {len(cmp.a.ops)}, {nb} {len(cmp.b.ops)} · matched "
             f"{count('matched') + count('changed')} ({count('changed')} changed) · added "
             f"{count('added')} · removed {count('removed')}"]
    for t, name in ((cmp.a, na), (cmp.b, nb)):
        origin = t.provenance.get("origin", "gold")
        lines.append(f"  {name}: {t.num_params:,} params, FLOPs {human(t.total_flops)}, "
                     f"{sum(op.time_ns for op in t.ops) / 1e6:.2f} ms, input {origin}"
                     + (", EDITED" if t.edited else ""))
    params = cmp.params
    if params:
        counts: dict[str, int] = {}
        for row in params:
            counts[row["status"]] = counts.get(row["status"], 0) + 1
        worst = max((r for r in params if r["status"] == "differ"),
                    key=lambda r: r["relative"], default=None)
        lines.append("  parameters: " + ", ".join(f"{n} modules {s}" for s, n in counts.items())
                     + (f" (furthest apart: {worst['module']}, relative "
                        f"{worst['relative']:.3g})" if worst else ""))
    changed = [r for r in cmp.rows if r.status == "changed"]
    for r in changed[:5]:
        lines.append(f"  changed: {r.where()}: {'; '.join(r.changes)}")
    if len(changed) > 5:
        lines.append(f"  ... {len(changed) - 5} more changed ops")
    if not cmp.compared:
        lines.append("  values: not saved on both sides, so structure and costs were compared; "
                     'to compare values: tl.trace(model, x, save="all") (or the sites)')
        return "\n".join(lines)
    differing = cmp.differing()
    lines.append(f"  values: {cmp.compared} ops compared (atol {cmp.atol:g}, rtol "
                 f"{cmp.rtol:g}): {len(differing)} differ")
    first = cmp.first_divergence()
    lines.append(f"  first divergence: {first.where()} ({first.numbers()})" if first else
                 "  first divergence: none (every compared value within the tolerance)")
    top = cmp.top(TOP)
    if top:
        lines.append("  largest differences (relative):")
        lines += top.lines()
    return "\n".join(lines)
