"""Attention patterns as pictures: what the html viewer's attention panel shows
(``page_patterns``) and a static picture of the same heatmaps (``save_patterns``).

A pattern is a saved ``blocks.{L}.attn.hook_pattern`` name of a trace
(``tl.trace(model, ids, save=["blocks.*.attn.hook_pattern"])``): batch row 0, one
``query × key`` heatmap per head. The axes read the input's tokens when the trace knows them
(a text input tokenized by torchlens-hf), else positions. Both pictures hold at most
``MAX_POSITIONS`` queries and keys (the first ones), and say so when they cut.
"""

from __future__ import annotations

import html
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..anatomy import anchor, transformer
from ..errors import DrawOptionError, LookupFailed, TorchLensError
from ..sites import name_of
from . import output

PATTERN = re.compile(r"blocks\.(\d+)\.attn\.hook_pattern")
MAX_POSITIONS = 64  # queries and keys per heatmap, the first ones
MAX_VALUES = 600_000  # numbers in one page, every layer together (a few MB of JSON)
DECIMALS = 4  # the page stores round(value * 10**DECIMALS) as an integer
RAMP = ("#f7fbff", "#6baed6", "#08306b")  # 0 → 1, the viewer's panel uses the same
HEADS_PER_ROW = 8  # heatmaps side by side in the static picture
FONT = 10  # the static picture's label size


@dataclass
class Pattern:
    """One layer's saved pattern: ``values`` is ``[head, query, key]`` (batch row 0, float32
    on the CPU); ``label`` the op the name resolved to, ``module`` that op's module."""

    layer: int
    name: str
    label: str
    module: str
    values: Tensor


def patterns(trace: Any) -> list[Pattern]:
    """The saved attention patterns of ``trace``, by layer (none: an empty list)."""
    names = (getattr(trace, "meta", None) or {}).get("names") or {}
    found = []
    for name in names:
        match = PATTERN.fullmatch(name)
        if match is None:
            continue
        try:
            named = trace[name]
            value = named.out if named.saved else None
            op = trace[named.label]
        except (TorchLensError, KeyError):
            continue
        if not isinstance(value, Tensor) or value.dim() != 4 or value.shape[0] < 1:
            continue
        found.append(Pattern(int(match[1]), name, named.label, getattr(op, "module", "") or "",
                             value[0].detach().to("cpu", torch.float32)))
    return sorted(found, key=lambda p: p.layer)


def input_tokens(trace: Any) -> list[str] | None:
    """The tokens of the input's first row, when the trace knows them (text tokenized by
    torchlens-hf, or an encoding whose tokenizer was found); else None."""
    resolver = (getattr(trace, "provenance", None) or {}).get("resolver") or {}
    rows = resolver.get("tokens") if isinstance(resolver, dict) else None
    if not rows or not isinstance(rows[0], list):
        return None
    return [_printable(str(t)) for t in rows[0]]


def axis_labels(tokens: list[str] | None, length: int) -> list[str]:
    """An axis of ``length`` positions: the tokens when there are as many, else 0, 1, ..."""
    if tokens is not None and len(tokens) == length:
        return list(tokens)
    return [str(i) for i in range(length)]


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "·" for c in text) or "·"


def _cut_note(cut: list[tuple[int, int]]) -> str | None:
    if not cut:
        return None
    longest = max(max(q, k) for q, k in cut)
    return f"showing the first {MAX_POSITIONS} queries and keys of {longest} positions"


# ---- the viewer's data -------------------------------------------------------------------------
def page_patterns(trace: Any) -> dict[str, Any] | None:
    """The attention panel's data (None: the trace holds no pattern, the page has no panel).

    ``layers[i].values[head][query][key]`` is ``round(value / scale)``, an integer (None where
    the value is not finite); ``queries``/``keys`` are the full lengths, the lists hold at most
    ``MAX_POSITIONS`` of each; ``tokens`` the input's (at most ``MAX_POSITIONS``), ``n_tokens``
    how many it has; ``note`` says what was cut, if anything."""
    found = patterns(trace)
    if not found:
        return None
    tokens = input_tokens(trace)
    layers, cut = [], []
    kept_layers, left_out = _within_budget(found)
    for p in kept_layers:
        heads, q, k = p.values.shape
        kept = p.values[:, :MAX_POSITIONS, :MAX_POSITIONS]
        if q > MAX_POSITIONS or k > MAX_POSITIONS:
            cut.append((q, k))
        layers.append({"layer": p.layer, "name": p.name, "op": p.label, "module": p.module,
                       "heads": heads, "queries": q, "keys": k, "values": _integers(kept)})
    notes = [n for n in (_cut_note(cut),) if n]
    if left_out:
        notes.append(f"layers {', '.join(map(str, left_out))} left out: a page holds at most "
                     f"{MAX_VALUES:,} numbers (torchlens.viz.save_patterns draws any layer)")
    return {"scale": 10.0 ** -DECIMALS, "tokens": tokens[:MAX_POSITIONS] if tokens else None,
            "n_tokens": len(tokens) if tokens else 0, "layers": layers,
            "note": "; ".join(notes) or None}


def _integers(values: Tensor) -> list:
    finite = torch.isfinite(values)
    scaled = torch.round(torch.where(finite, values, 0.0).double() * 10**DECIMALS).long()
    out = scaled.tolist()
    if not bool(finite.all()):
        for h, q, k in (~finite).nonzero().tolist():
            out[h][q][k] = None
    return out


# ---- the static picture ------------------------------------------------------------------------
def save_patterns(trace: Any, path: str | os.PathLike, layer: int | None = None) -> Path:
    """Write ``trace``'s attention patterns as one picture: a row per layer (only ``layer``
    when given), one ``query × key`` heatmap per head, token labels on both axes, each cell's
    value in its tooltip. ``path`` ending ``.svg`` writes an SVG, ``.html`` a page holding it.
    Returns the path written."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".svg", ".html"):
        raise DrawOptionError(f"path={str(path)!r}: save_patterns writes .svg or .html",
                              teach=[f'save_patterns(trace, "{Path(path).stem}.svg")'])
    found = patterns(trace)
    if not found:
        raise TorchLensError(
            "this trace holds no saved attention pattern (blocks.{L}.attn.hook_pattern)",
            code="activation_not_saved",
            teach=['trace = tl.trace(model, ids, save=["blocks.*.attn.hook_pattern"])'])
    if layer is not None:
        chosen = [p for p in found if p.layer == layer]
        if not chosen:
            held = [p.layer for p in found]
            raise LookupFailed(f"layer {layer} has no saved pattern in this trace (it holds "
                               f"layers {', '.join(map(str, held))})", code="key_not_found",
                               teach=[f"save_patterns(trace, path, layer={held[0]})",
                                      "save_patterns(trace, path)  # every layer"])
        found = chosen
    title = f"{(getattr(trace, 'meta', None) or {}).get('model_class') or 'model'}: attention"
    svg = patterns_svg(found, input_tokens(trace), title)
    if suffix == ".html":
        svg = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
               f"<title>{html.escape(title)}</title></head>"
               f'<body style="margin:0;background:#fff">\n{svg}\n</body></html>\n')
    return output.write_to(path, svg.encode("utf-8"))


def patterns_svg(found: list[Pattern], tokens: list[str] | None, title: str) -> str:
    """The SVG of ``save_patterns``: a ``<g class="layer">`` per layer, a ``<g class="head">``
    per head (``HEADS_PER_ROW`` to a row), a ``<rect>`` per cell with its value in
    ``<title>``; layers past ``MAX_VALUES`` numbers are left out, and the picture says so."""
    kept, left_out = _within_budget(found)
    rows, width, y, cut = [], 420.0, 34.0, []
    for p in kept:
        heads, q_len, k_len = p.values.shape
        if q_len > MAX_POSITIONS or k_len > MAX_POSITIONS:
            cut.append((q_len, k_len))
        grid = _Grid(p, tokens)
        parts = [f'<g class="layer" data-layer="{p.layer}" data-op="{_esc(p.label)}">'
                 f'<text x="8" y="{y + 12:.1f}" font-weight="600">layer {p.layer} · '
                 f"{_esc(p.name)} → {_esc(p.label)}</text>"]
        for h in range(heads):
            column, row = h % HEADS_PER_ROW, h // HEADS_PER_ROW
            parts.append(grid.head(h, 8 + column * grid.width, y + 20 + row * grid.height))
        parts.append("</g>")
        rows.append("".join(parts))
        width = max(width, 16 + min(heads, HEADS_PER_ROW) * grid.width)
        y += 20 + -(-heads // HEADS_PER_ROW) * grid.height + 4
    notes = [n for n in (_cut_note(cut),) if n]
    if left_out:
        notes.append(f"layers {', '.join(map(str, left_out))} left out (at most "
                     f"{MAX_VALUES:,} numbers; pass layer=)")
    header = (f'<text x="8" y="16" font-weight="600" font-size="13">{_esc(title)}</text>'
              f'<text class="note" x="8" y="29" fill="#57606a">colour 0 → 1 (white → blue)'
              f"{''.join(' · ' + _esc(n) for n in notes)}</text>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{y:.0f}" '
            f'viewBox="0 0 {width:.0f} {y:.0f}" font-family="Helvetica, Arial, sans-serif" '
            f'font-size="{FONT}"><rect width="100%" height="100%" fill="#ffffff"/>'
            f"{header}{''.join(rows)}</svg>\n")


class _Grid:
    """The heatmaps of one layer: cell size, label margins, and one head's SVG."""

    def __init__(self, p: Pattern, tokens: list[str] | None):
        _, q_len, k_len = p.values.shape
        self.layer, self.values = p.layer, p.values[:, :MAX_POSITIONS, :MAX_POSITIONS]
        self.queries = axis_labels(tokens, q_len)[:MAX_POSITIONS]
        self.keys = axis_labels(tokens, k_len)[:MAX_POSITIONS]
        self.q_named = _quoted(tokens, q_len, self.queries)
        self.k_named = _quoted(tokens, k_len, self.keys)
        nq, nk = len(self.queries), len(self.keys)
        self.cell = max(3, min(16, 240 // max(nq, nk, 1)))
        self.step = -(-11 // self.cell)  # a label every `step` cells: small cells stay readable
        self.left = 6 + FONT * 0.62 * max(len(_short(t)) for t in self.queries[::self.step])
        self.top = 6 + FONT * 0.62 * max(len(_short(t)) for t in self.keys[::self.step])
        self.width = self.left + self.cell * nk + 14
        self.height = 14 + self.top + self.cell * nq + 12

    def head(self, h: int, x0: float, y0: float) -> str:
        cell, left = self.cell, x0 + self.left
        gy = y0 + 14 + self.top
        parts = [f'<g class="head" data-layer="{self.layer}" data-head="{h}">'
                 f'<text x="{left:.1f}" y="{y0 + 10:.1f}">head {h}</text>']
        for j in range(0, len(self.keys), self.step):
            cx, cy = left + cell * j + cell / 2 + 3, gy - 3
            parts.append(f'<text class="key" x="{cx:.1f}" y="{cy:.1f}" transform="rotate(-90 '
                         f'{cx:.1f} {cy:.1f})">{_esc(_short(self.keys[j]))}</text>')
        for i in range(0, len(self.queries), self.step):
            y = gy + cell * i + cell / 2 + 3
            parts.append(f'<text class="query" x="{left - 3:.1f}" y="{y:.1f}" text-anchor="end">'
                         f"{_esc(_short(self.queries[i]))}</text>")
        for i, row in enumerate(self.values[h].tolist()):
            where = f"head {h} · query {i}{_esc(self.q_named[i])} → key "
            for j, v in enumerate(row):
                parts.append(f'<rect x="{left + cell * j:.1f}" y="{gy + cell * i:.1f}" '
                             f'width="{cell}" height="{cell}" fill="{_colour(v)}"><title>{where}'
                             f"{j}{_esc(self.k_named[j])}: {v:.4f}</title></rect>")
        parts.append("</g>")
        return "".join(parts)


def _within_budget(found: list[Pattern]) -> tuple[list[Pattern], list[int]]:
    """The layers that fit ``MAX_VALUES`` numbers (cut to ``MAX_POSITIONS``), and those left out."""
    kept, left_out, used = [], [], 0
    for p in found:
        size = p.values[:, :MAX_POSITIONS, :MAX_POSITIONS].numel()
        if used + size > MAX_VALUES:
            left_out.append(p.layer)
        else:
            kept.append(p)
            used += size
    return kept, left_out


def _quoted(tokens: list[str] | None, length: int, labels: list[str]) -> list[str]:
    """What a tooltip adds after a position: the token, quoted (nothing for a bare position)."""
    return [f' "{t}"' for t in labels] if tokens is not None and len(tokens) == length else \
        [""] * len(labels)


def _short(text: str, limit: int = 12) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def _colour(value: float) -> str:
    if value != value:  # NaN: a fully masked row
        return "#d0d7de"
    t = min(1.0, max(0.0, value))
    a, b, s = (RAMP[0], RAMP[1], t * 2) if t < 0.5 else (RAMP[1], RAMP[2], t * 2 - 1)
    x, y = (tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in (a, b))
    return "#" + "".join(f"{round(u + (w - u) * s):02x}" for u, w in zip(x, y))


def page_names(trace: Any) -> dict[str, str]:
    """Every transformer name the traced model has, mapped to the op label it stands on (the
    viewer's search takes them): the names the capture bound, and, for a live model's trace,
    the whole vocabulary its architecture has. Empty for a model that is no transformer."""
    names = dict(trace.meta.get("names") or {})
    if trace._objects.get("model") is not None:
        try:
            view = transformer(trace)
            for name in view.names:
                names.setdefault(name, anchor(view.structure, name, view.model).label)
        except TorchLensError:
            pass  # no block list: no names
    return {name: name_of(label) for name, label in names.items()}
