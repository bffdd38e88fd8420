"""The result of a patching sweep: a grid of metrics (sites x positions), as a table, a tensor,
a pandas frame and a self-contained HTML heatmap."""

from __future__ import annotations

import html
import math
import os

import torch

from ..errors import TorchLensError


class PatchingSweep:
    """``values[i, j]``: the metric with site ``sites[i]`` patched at ``positions[j]``,
    normalised so that the corrupt run is 0 and the clean run is 1 (``raw`` holds the metric
    itself; NaN everywhere when both baselines are equal)."""

    title = "Patching sweep"

    def __init__(self, sites: list[str], positions: list[int], raw: torch.Tensor,
                 clean_metric: float, corrupt_metric: float, batch_size: int, forwards: int):
        self.sites, self.positions, self.raw = sites, positions, raw
        self.clean_metric, self.corrupt_metric = clean_metric, corrupt_metric
        self.batch_size, self.forwards = batch_size, forwards
        span = clean_metric - corrupt_metric
        self.values = (raw - corrupt_metric) / span if span else torch.full_like(raw, math.nan)

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        head = ["site"] + [str(p) for p in self.positions]
        rows = [head] + [[site] + [f"{v:.2f}" for v in row.tolist()]
                         for site, row in zip(self.sites, self.values)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [f"{self.title}: {len(self.sites)} sites x {len(self.positions)} positions, "
                 f"{self.forwards} forwards (batch_size={self.batch_size}); clean metric "
                 f"{self.clean_metric:.4g} = 1, corrupt {self.corrupt_metric:.4g} = 0"]
        lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                            for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
        return "\n".join(lines)

    def to_pandas(self):
        """The normalised grid: one row per site, one column per position."""
        try:
            import pandas
        except ImportError as exc:
            raise TorchLensError("sweep.to_pandas() needs pandas, which is not installed",
                                 code="dependency_missing",
                                 teach=["pip install pandas", "sweep.values  # a tensor"]) from exc
        return pandas.DataFrame(self.values.tolist(), index=self.sites, columns=self.positions)

    def save(self, path: str | os.PathLike) -> None:
        """One self-contained HTML page: the grid as a heatmap (blue below the corrupt run,
        red towards the clean run), each cell's raw metric on hover."""
        cells = []
        for site, row, raw in zip(self.sites, self.values.tolist(), self.raw.tolist()):
            tds = "".join(
                f"<td style='background:{_colour(v)}' title='{html.escape(site)} @ {p}: "
                f"metric {r:.5g}'>{'' if math.isnan(v) else f'{v:.2f}'}</td>"
                for p, v, r in zip(self.positions, row, raw))
            cells.append(f"<tr><th>{html.escape(site)}</th>{tds}</tr>")
        head = "".join(f"<th>{p}</th>" for p in self.positions)
        page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>TorchLens patching sweep</title><style>
body{{font:13px system-ui,sans-serif;margin:24px}} table{{border-collapse:collapse}}
td,th{{padding:4px 6px;text-align:center;border:1px solid #ddd}} th{{background:#fafafa}}
</style></head><body><h2>Activation patching</h2>
<p>{html.escape(str(self).splitlines()[0])}</p>
<table><thead><tr><th>site \\ position</th>{head}</tr></thead><tbody>{''.join(cells)}</tbody>
</table></body></html>
"""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(page)


def _colour(v: float) -> str:
    """White at 0, red towards 1 (and beyond), blue below 0."""
    if math.isnan(v):
        return "#eeeeee"
    t = max(-1.0, min(1.0, v))
    fade = int(255 * (1 - abs(t)))
    return f"rgb(255,{fade},{fade})" if t >= 0 else f"rgb({fade},{fade},255)"


__all__ = ["PatchingSweep"]
