"""The result of a patching sweep: a grid of metrics (sites x positions), as a table, a tensor,
a pandas frame and a self-contained HTML heatmap."""

from __future__ import annotations

import html
import math
import os
from typing import Any

import torch

from ..errors import pandas_for

DECIMALS = 3  # every number a sweep prints, unless its metrics need more to tell them apart
BLUE, WHITE, RED = (33, 102, 172), (247, 247, 247), (178, 24, 43)  # a diverging scale (RdBu)


class PatchingSweep:
    """``values[i, j]``: the metric with site ``sites[i]`` patched at ``positions[j]``,
    normalised so that the corrupt run is 0 and the clean run is 1 (``raw`` holds the metric
    itself; NaN everywhere when both baselines are equal). ``tokens``: the input's tokens
    (first row) when its tokenizer is known, shown on the heatmap's position axis."""

    title = "Patching sweep"

    def __init__(self, sites: list[str], positions: list[int], raw: torch.Tensor,
                 clean_metric: float, corrupt_metric: float, batch_size: int, forwards: int,
                 tokens: list[str] | None = None):
        self.sites, self.positions, self.raw = sites, positions, raw
        self.clean_metric, self.corrupt_metric = clean_metric, corrupt_metric
        self.batch_size, self.forwards = batch_size, forwards
        self.tokens = tokens
        span = clean_metric - corrupt_metric
        self.values = (raw - corrupt_metric) / span if span else torch.full_like(raw, math.nan)
        # one precision for every number printed: enough for the metrics' span to show
        self.decimals = DECIMALS if not span or not math.isfinite(span) else \
            max(DECIMALS, min(6, 2 - math.floor(math.log10(abs(span)))))

    def _num(self, v: float) -> str:
        """``v`` with the sweep's decimals ("0.0000", not "-0.0000", for what rounds to 0)."""
        if math.isnan(v):
            return "nan"
        text = f"{v:.{self.decimals}f}"
        return text[1:] if text.startswith("-") and float(text) == 0 else text

    def _heading(self) -> str:
        return (f"{self.title}: {len(self.sites)} sites x {len(self.positions)} positions, "
                f"{self.forwards} forwards (batch_size={self.batch_size}); clean metric "
                f"{self._num(self.clean_metric)} = 1, corrupt {self._num(self.corrupt_metric)}"
                " = 0")

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        head = ["site"] + [str(p) for p in self.positions]
        rows = [head] + [[site] + [self._num(v) for v in row.tolist()]
                         for site, row in zip(self.sites, self.values)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [self._heading()]
        lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                            for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
        return "\n".join(lines)

    def to_pandas(self):
        """The normalised grid: one row per site, one column per position."""
        pandas = pandas_for("sweep.to_pandas()", "sweep.values  # a tensor")
        return pandas.DataFrame(self.values.tolist(), index=self.sites, columns=self.positions)

    def position_labels(self) -> list[str]:
        """The position axis: each position's token when the tokens are known, else ""."""
        tokens = self.tokens or []
        n = len(tokens)
        return [str(tokens[p]) if n and -n <= p < n else "" for p in self.positions]

    def limit(self) -> float:
        """The colour scale's end: at least 1 (the clean run), more when a cell goes past."""
        finite = self.values[torch.isfinite(self.values)]
        return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0

    def save(self, path: str | os.PathLike) -> None:
        """One self-contained HTML page: the grid as a heatmap on a diverging scale centred on
        the corrupt run (0, white; red towards the clean run, 1, and beyond; blue below 0), a
        colour legend with 1 (clean) marked, the tokens over their positions when known, each
        cell's raw metric on hover, every number with the same decimals."""
        esc = html.escape
        limit = self.limit()
        cells = []
        for site, row, raw in zip(self.sites, self.values.tolist(), self.raw.tolist()):
            tds = "".join(
                f"<td style='background:{_colour(v, limit)};color:{_ink(v, limit)}' "
                f"data-v='{self._num(v)}' title='{esc(site)} @ {p}: metric {self._num(r)}'>"
                f"{'' if math.isnan(v) else self._num(v)}</td>"
                for p, v, r in zip(self.positions, row, raw))
            cells.append(f"<tr><th class='site'>{esc(site)}</th>{tds}</tr>")
        head = "".join(
            f"<th class='pos' data-pos='{p}'>{p}" + (f"<br><span class='tok'>{esc(t)}</span>"
                                                      if t else "") + "</th>"
            for p, t in zip(self.positions, self.position_labels()))
        corner = "site \\ position" + (" (token)" if any(self.position_labels()) else "")
        page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>TorchLens patching sweep</title><style>
body{{font:13px system-ui,sans-serif;margin:24px}} table{{border-collapse:collapse}}
td,th{{padding:4px 6px;text-align:center;border:1px solid #ddd}} th{{background:#fafafa}}
td{{font-variant-numeric:tabular-nums}} th.site{{text-align:left}}
.tok{{font-weight:normal;font-family:ui-monospace,monospace;white-space:pre}}
.legend text{{font:11px system-ui,sans-serif;fill:#333}}
</style></head><body><h2>Activation patching</h2>
<p>{esc(self._heading())}</p>
{self._legend(limit)}
<table><thead><tr><th>{corner}</th>{head}</tr></thead><tbody>{''.join(cells)}</tbody>
</table></body></html>
"""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(page)

    def _legend(self, limit: float) -> str:
        """The colour scale as inline SVG: -limit .. 0 (corrupt, white) .. 1 (clean) .. limit,
        each end's number beside the bar, 0 and 1 marked under it."""
        width, left, top = 320, 70, 22
        right = left + width

        def x(v: float) -> float:
            return left + width * (v + limit) / (2 * limit)

        stops = "".join(f"<stop offset='{k / 8:.3f}' "
                        f"stop-color='{_colour((k / 4 - 1) * limit, limit)}'/>" for k in range(9))
        marks = "".join(
            f"<line x1='{x(v):.1f}' x2='{x(v):.1f}' y1='{top - 3}' y2='{top + 15}' "
            f"stroke='#333'/><text class='tick' data-v='{self._num(v)}' x='{x(v):.1f}' "
            f"y='{top + 27}' text-anchor='middle'>{self._num(v)}</text><text class='name' "
            f"x='{x(v):.1f}' y='{top + 39}' text-anchor='middle'>{name}</text>"
            for v, name in ((0.0, "corrupt"), (1.0, "clean")))
        ends = (f"<text class='tick' data-v='{self._num(-limit)}' x='{left - 6}' y='{top + 10}' "
                f"text-anchor='end'>{self._num(-limit)}</text>")
        if limit > 1:  # at 1 the clean mark is the end
            ends += (f"<text class='tick' data-v='{self._num(limit)}' x='{right + 6}' "
                     f"y='{top + 10}'>{self._num(limit)}</text>")
        nan = "" if not bool(torch.isnan(self.values).any()) else (
            f"<rect x='{right + 70}' y='{top}' width='12' height='12' fill='#eeeeee' "
            f"stroke='#bbb'/><text x='{right + 86}' y='{top + 10}'>NaN: clean = corrupt</text>")
        return (f"<svg class='legend' width='{right + 220}' height='{top + 44}' role='img' "
                f"aria-label='colour scale' data-min='{self._num(-limit)}' "
                f"data-max='{self._num(limit)}'><defs><linearGradient id='tl-scale'>{stops}"
                f"</linearGradient></defs><text x='0' y='12'>colour: the patched metric, "
                f"corrupt run 0, clean run 1</text><rect x='{left}' y='{top}' width='{width}' "
                f"height='12' fill='url(#tl-scale)' stroke='#bbb'/>{ends}{marks}{nan}</svg>")


def sweep_tokens(source: Any, site: str) -> list[str] | None:
    """The clean input's tokens (first row) when its tokenizer is known and they are as many
    as ``site``'s positions (dimension 1 of its value in the clean trace ``source``); else
    None, and the heatmap's position axis shows positions only."""
    from ..viz.attention import input_tokens

    tokens = input_tokens(source)
    if tokens is None:
        return None
    target = source[site]
    value = (target.calls[0] if hasattr(target, "calls") else target).out
    value = value[0] if isinstance(value, tuple) else value
    return tokens if value.dim() >= 2 and value.shape[1] == len(tokens) else None


def _mix(a: tuple, b: tuple, t: float) -> tuple:
    return tuple(round(x + (y - x) * t) for x, y in zip(a, b))


def _colour(v: float, limit: float = 1.0) -> str:
    """A diverging scale centred on 0 (white): red towards +limit, blue towards -limit."""
    if math.isnan(v):
        return "#eeeeee"
    t = max(-1.0, min(1.0, v / limit))
    r, g, b = _mix(WHITE, RED if t >= 0 else BLUE, abs(t))
    return f"rgb({r},{g},{b})"


def _ink(v: float, limit: float) -> str:
    """Text that reads on the cell: white on a deep colour."""
    return "#fff" if not math.isnan(v) and abs(v) / limit > 0.6 else "#111"


__all__ = ["PatchingSweep"]
