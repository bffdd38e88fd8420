"""``tl.patching.sweep``: activation patching over sites x positions, one cell a patch of the
clean run's value into the corrupt run, several cells batched into one forward.

The clean run is captured once (only the swept sites saved); each forward then runs through the
lightest capture there is (``taps.edited_forward``: module boundaries only, plus per-op
numbering when a site is an op label), with every cell's edit proven to fire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..anatomy import expand_names, name_sites
from ..capture.boundaries import leaves
from ..capture.taps import edited_forward
from ..edits.plan import EditPlan
from ..edits.values import Edit, fit, source_value
from ..errors import CaptureError, InputError, InputTypeError
from ..sites import resolve
from ..units import format_shape, format_shapes
from .grid import PatchingSweep

SURFACE = "patching.sweep"


class _CellPatch(Edit):
    """The clean value at ``(row, position)`` for each cell a batched forward carries."""

    kind = "patch"

    def __init__(self, source: Any, cells: list[tuple[int, int]]):
        super().__init__()
        self.source, self.cells = source, cells

    def check(self, site, plan):
        plan.check_source(self.source, site)

    def new(self, part, where):
        clean = source_value(self.source, where)
        fit(clean[:1], part[:1], where)  # the shapes agree but for the batch
        out = part.clone()
        for row, position in self.cells:
            out[row, position] = clean[0, position]
        return out


def sweep(model: nn.Module, clean: Any, corrupt: Any, /, *, sites: str | Iterable[str],
          metric: Callable[[Any], Any], positions: Iterable[int] | None = None,
          batch_size: int = 1, tokenizer: Any = None, processor: Any = None,
          preprocess: Any = None) -> PatchingSweep:
    """Patch the clean value of each site (op labels, module addresses, globs) at each position
    of dimension 1 (default: every position) into the corrupt run; ``metric(output)`` per cell,
    normalised to the clean (1) and corrupt (0) runs. ``batch_size`` cells share one forward
    (the corrupt input repeated along its batch dimension); the first cell is checked against a
    forward of its own, so a model whose rows are not independent refuses instead of answering
    wrong."""
    from ..verbs import trace

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size= takes a positive int, not {batch_size!r}",
                         code="option_invalid", teach=["tl.patching.sweep(..., batch_size=16)"])
    inv, rows, good, bad = prepare(model, clean, corrupt, sites, metric, SURFACE,
                                   "metric=lambda out: out.logits[0, -1, 42] - "
                                   "out.logits[0, -1, 7]", batch_size,
                                   (tokenizer, processor, preprocess))
    with torch.no_grad():
        source = trace(model, clean, save=rows, tokenizer=tokenizer,
                       processor=processor, preprocess=preprocess)
        clean_metric = float(metric(model(*good.args, **good.kwargs)))
        corrupt_metric = float(metric(model(*bad.args, **bad.kwargs)))
        positions = checked_positions(source, rows[0], positions, "tl.patching.sweep")
        cells = [(i, j) for i in range(len(rows)) for j in range(len(positions))]
        raw = torch.empty(len(rows), len(positions), dtype=torch.float64)
        forwards = 0
        for start in range(0, len(cells), batch_size):
            chunk = cells[start:start + batch_size]
            values = _run(model, inv, source, rows, positions, chunk, bad, metric)
            forwards += 1
            for (i, j), value in zip(chunk, values):
                raw[i, j] = value
            if start == 0 and len(chunk) > 1:
                _check_batching(model, inv, source, rows, positions, chunk[0], bad, metric,
                                values[0])
                forwards += 1
    return PatchingSweep(rows, positions, raw, clean_metric, corrupt_metric, batch_size,
                         forwards)


def prepare(model: nn.Module, clean: Any, corrupt: Any, sites: Any, metric: Any,
            surface: str, example: str, batch_size: int, resolvers: tuple) -> tuple:
    """What a sweep and its gradient estimate check before any forward: the metric, the sites
    (each glob's modules), both inputs resolved and of one shape. Returns (the model's
    inventory, the sites, the clean and the corrupt resolution)."""
    from ..capture.entry import checked_inventory, input_options, resolve_for

    inv = checked_inventory(model, surface)
    if not callable(metric):
        raise InputTypeError(f"metric takes a function of the model's output, not {metric!r}",
                             code="option_invalid", teach=[example])
    rows = _rows(model, inv, [sites] if isinstance(sites, str) else list(sites))
    options = input_options(*resolvers)
    good, bad = (resolve_for(model, value, input_kwargs=None, input_shape=None,
                             surface=surface, options=options) for value in (clean, corrupt))
    _check_inputs(good, bad, batch_size)
    rows = expand_names(model, good.args, good.kwargs, inv, rows)
    return inv, rows, good, bad


def _rows(model: nn.Module, inv: Any, texts: list[str]) -> list[str]:
    """Each site a glob expands to, once, in order."""
    if not texts or not all(isinstance(t, str) for t in texts):
        raise InputTypeError(f"sites= takes site strings, not {texts!r}", code="option_invalid",
                             teach=["tl.patching.sweep(..., sites=['transformer.h.*'])"])
    addresses = [address for address, _ in inv.modules]
    rows: dict[str, None] = {}
    for text in texts:
        for site in resolve(text, addresses, option="sites=", model_class=type(model).__name__,
                            code="edit_site_unknown",
                            example=lambda c: f"tl.patching.sweep(..., sites=[{c!r}])"):
            if site.kind in ("op", "name"):  # a transformer name is bound once inputs are known
                rows[site.text] = None
            else:
                rows[site.name if site.pass_num is None else
                     f"{site.name}:{site.pass_num}"] = None
    return list(rows)


def _check_inputs(good: Any, bad: Any, batch_size: int) -> None:
    a, b = leaves((good.args, good.kwargs), []), leaves((bad.args, bad.kwargs), [])
    if [tuple(t.shape) for t in a] != [tuple(t.shape) for t in b]:
        raise InputError(
            f"the clean and corrupt inputs differ in shape ({format_shapes(t.shape for t in a)} "
            f"vs {format_shapes(t.shape for t in b)}): a patch moves values between the same "
            "positions",
            code="patching_inputs_mismatch",
            teach=["pad or truncate both prompts to the same number of tokens"])
    if batch_size > 1 and any(t.dim() == 0 or t.shape[0] != 1 for t in b):
        raise InputError("batch_size > 1 repeats the corrupt input along its batch dimension, "
                         "which must be 1", code="option_invalid",
                         teach=["tl.patching.sweep(..., batch_size=1)"])


def checked_positions(source: Any, row: str, positions: Iterable[int] | None,
                      surface: str) -> list[int]:
    """``positions=`` checked against dimension 1 of ``row``'s value (None: all of them)."""
    length = _positions(source, row)
    positions = list(range(length)) if positions is None else list(positions)
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, int) or not -length <= p < length:
            raise InputError(f"positions= holds {p!r}, not a position of dimension 1 "
                             f"(length {length})", code="option_invalid",
                             teach=[f"{surface}(..., positions=range({length}))"])
    return positions


def _positions(source: Any, row: str) -> int:
    target = source[row]
    value = (target.calls[0] if hasattr(target, "calls") else target).out
    value = value[0] if isinstance(value, tuple) else value
    if value.dim() < 2:
        raise InputError(f"the value at {row!r} has shape {format_shape(value.shape)}: no "
                         "dimension 1 to sweep", code="option_invalid",
                         teach=["tl.patching.sweep(..., sites=[...])  # sites with positions"])
    return value.shape[1]


def _run(model, inv, source, rows, positions, chunk, bad, metric) -> list[float]:
    """One forward for the cells of ``chunk``: row r of the batch carries cell r's patch."""
    by_site: dict[str, list[tuple[int, int]]] = {}
    for r, (i, j) in enumerate(chunk):
        by_site.setdefault(rows[i], []).append((r, positions[j]))
    plan = EditPlan({site: _CellPatch(source, cells) for site, cells in by_site.items()}, inv,
                    model, surface=SURFACE,
                    named=name_sites(model, bad.args, bad.kwargs, inv, list(by_site)))
    n = len(chunk)
    args, kwargs = (bad.args, bad.kwargs) if n == 1 else (_repeat(bad.args, n),
                                                           _repeat(bad.kwargs, n))
    out = edited_forward(model, args, kwargs, plan, inv)
    if n == 1:
        return [float(metric(out))]
    return [float(metric(_row(out, r))) for r in range(n)]


def _check_batching(model, inv, source, rows, positions, cell, bad, metric, batched) -> None:
    alone = _run(model, inv, source, rows, positions, [cell], bad, metric)[0]
    if abs(alone - batched) > 1e-4 * max(1.0, abs(alone)):
        raise CaptureError(
            f"a cell patched in a batch gave {batched:.6g}, alone {alone:.6g}: this model's "
            "batch rows are not independent (batch statistics, a mask over the batch)",
            code="patching_batch_unsafe",
            teach=["tl.patching.sweep(..., batch_size=1)"])


def _repeat(value: Any, n: int) -> Any:
    if isinstance(value, Tensor):
        return value.repeat(n, *([1] * (value.dim() - 1)))
    if isinstance(value, tuple):
        return tuple(_repeat(v, n) for v in value)
    if isinstance(value, list):
        return [_repeat(v, n) for v in value]
    if isinstance(value, Mapping):
        return type(value)({k: _repeat(v, n) for k, v in value.items()})
    return value


def _row(out: Any, r: int) -> Any:
    """Row ``r`` of a batched output, with batch dimension 1, in the output's own types."""
    if isinstance(out, Tensor):
        return out[r:r + 1] if out.dim() else out
    if isinstance(out, Mapping):
        items = {k: _row(v, r) for k, v in out.items()}
        try:
            return type(out)(**items)
        except TypeError:
            return items
    if isinstance(out, (tuple, list)) and not hasattr(out, "_fields"):
        return type(out)(_row(v, r) for v in out)
    return out
