"""``tl.patching.sweep``: activation patching over sites x positions, one cell a patch of the
clean run's value into the corrupt run, several cells batched into one forward.

The clean run is captured once (only the swept sites saved); each forward then runs through the
lightest capture there is (``taps.edited_forward``: module boundaries only, plus per-op
numbering when a site is an op label), with every cell's edit proven to fire.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from ..anatomy import expand_names, name_sites
from ..capture.boundaries import leaves
from ..capture.taps import edited_forward
from ..edits.plan import EditPlan
from ..edits.values import Edit, fit, source_value
from ..errors import (
    CaptureError,
    InputError,
    InputTypeError,
    TorchLensError,
    first_line,
    surface_call,
)
from ..sites import resolve
from ..units import format_shape, format_shapes
from .grid import PatchingSweep, sweep_tokens

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
          batch_size: int | None = None, tokenizer: Any = None, processor: Any = None,
          preprocess: Any = None) -> PatchingSweep:
    """Patch the clean value of each site (op labels, module addresses, globs) at each position
    of dimension 1 (default: every position) into the corrupt run; ``metric(output)`` per cell,
    normalised to the clean (1) and corrupt (0) runs. ``batch_size`` cells share one forward
    (the corrupt input repeated along its batch dimension); the first cell is checked against a
    forward of its own, so a model whose rows are not independent refuses instead of answering
    wrong. The default batches ``AUTO_BATCH`` cells where the corrupt input has one row and that
    check holds, and runs a cell a forward where it does not."""
    from ..verbs import trace

    call = SweepCall(SURFACE, sites)
    auto = batch_size is None
    if not auto and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                     or batch_size < 1):
        raise InputError(f"batch_size= takes a positive int, not {batch_size!r}",
                         code="option_invalid", teach=[call.text(batch_size=16)])
    inv, rows, good, bad = prepare(model, clean, corrupt, sites, metric, call,
                                   1 if auto else batch_size, (tokenizer, processor, preprocess))
    if auto:
        batch_size = AUTO_BATCH if _one_row(bad) else 1
    with torch.no_grad():
        out = model(*good.args, **good.kwargs)
        clean_metric = metric_value(metric, out, "clean", call)
        corrupt_metric = metric_value(metric, model(*bad.args, **bad.kwargs), "corrupt", call)
        check_baselines(clean_metric, corrupt_metric, call, out)
        del out
        source = trace(model, clean, save=rows, tokenizer=tokenizer,
                       processor=processor, preprocess=preprocess)
        positions = checked_positions(source, rows, positions, call)
        cells = [(i, j) for i in range(len(rows)) for j in range(len(positions))]
        raw = torch.empty(len(rows), len(positions), dtype=torch.float64)
        forwards = start = 0
        while start < len(cells):
            chunk = cells[start:start + batch_size]
            values = _run(model, inv, source, rows, positions, chunk, bad, metric, call)
            forwards += 1
            if start == 0 and len(chunk) > 1:
                alone = _run(model, inv, source, rows, positions, chunk[:1], bad, metric,
                             call)[0]
                forwards += 1
                if abs(alone - values[0]) > 1e-4 * max(1.0, abs(alone)):
                    if not auto:
                        raise CaptureError(
                            f"a cell patched in a batch gave {values[0]:.6g}, alone "
                            f"{alone:.6g}: this model's batch rows are not independent (batch "
                            "statistics, a mask over the batch)",
                            code="patching_batch_unsafe", teach=[call.text(batch_size=1)])
                    batch_size, chunk, values = 1, chunk[:1], [alone]  # a cell a forward
            for (i, j), value in zip(chunk, values):
                raw[i, j] = value
            start += len(chunk)
    return PatchingSweep(rows, positions, raw, clean_metric, corrupt_metric, batch_size,
                         forwards, tokens=sweep_tokens(source, rows[0]))


def prepare(model: nn.Module, clean: Any, corrupt: Any, sites: Any, metric: Any,
            call: SweepCall, batch_size: int, resolvers: tuple) -> tuple:
    """What a sweep and its gradient estimate check before any forward: the metric, the sites
    (each glob's modules), both inputs resolved and of one shape. Returns (the model's
    inventory, the sites, the clean and the corrupt resolution)."""
    from ..capture.entry import checked_inventory, input_options, resolve_for

    inv = checked_inventory(model, call.surface)
    if not callable(metric):
        raise InputTypeError(f"metric takes a function of the model's output, not {metric!r}",
                             code="option_invalid", teach=[call.text(metric=LOGIT_DIFF)])
    rows = _rows(model, inv, [sites] if isinstance(sites, str) else
                 list(sites) if isinstance(sites, Iterable) else sites, call)
    options = input_options(*resolvers)
    good, bad = (resolve_for(model, value, input_kwargs=None, input_shape=None,
                             surface=call.surface, options=options)
                 for value in (clean, corrupt))
    _check_inputs(good, bad, batch_size, call)
    rows = expand_names(model, good.args, good.kwargs, inv, rows)
    return inv, rows, good, bad


LOGIT_DIFF = "lambda out: out.logits[0, -1, 42] - out.logits[0, -1, 7]"


class SweepCall:
    """The user's call of a sweep surface (``tl.patching.sweep`` or
    ``tl.attribution.patching``, whose metric is positional), for its teaches."""

    def __init__(self, surface: str, sites: Any):
        self.surface = surface
        text = repr(sites)
        self.sites = text if len(text) <= 60 and isinstance(sites, (str, list, tuple)) \
            else "[...]"

    def text(self, comment: str = "", *, sites: str | None = None, metric: str = "metric",
             **more: Any) -> str:
        """The call with ``sites`` (as code), ``metric`` (as code) and ``more`` keywords."""
        sites = self.sites if sites is None else sites
        options = f"sites={sites}, metric={metric}" if self.surface == SURFACE else \
            f"{metric}, sites={sites}"
        options += "".join(f", {k}={v!r}" for k, v in more.items())
        text = surface_call(self.surface, options)
        return f"{text}  # {comment}" if comment else text

    def with_metric(self, out: Any, comment: str = "") -> str:
        """The call with a metric that gives one number of ``out`` (the model's output)."""
        return self.text(comment, metric=metric_code(out))


def metric_code(out: Any) -> str:
    """A metric giving one number of the output ``out``, as code: a difference of two
    entries of its last dimension (of ``out.logits`` where it has them), the first row and
    the last position."""
    logits = out.get("logits") if isinstance(out, Mapping) else getattr(out, "logits", None)
    value, name = (logits, "out.logits") if isinstance(logits, Tensor) else (out, "out")
    if not isinstance(value, Tensor):
        return LOGIT_DIFF
    if value.dim() == 0:
        return f"lambda {name.partition('.')[0]}: {name}"
    lead = "".join(["0, "] + ["-1, "] * (value.dim() - 2)) if value.dim() > 1 else ""
    if value.shape[-1] < 2:
        return f"lambda out: {name}[{lead}0]"
    a, b = min(42, value.shape[-1] - 1), min(7, value.shape[-1] - 2)
    return f"lambda out: {name}[{lead}{a}] - {name}[{lead}{b}]"


def metric_value(metric: Callable[[Any], Any], out: Any, run: str, call: SweepCall) -> float:
    """``metric(out)`` as one finite number; anything else (a vector, a non-number, NaN, an
    exception of the metric's own) refuses ``metric_invalid``, teaching the user's call with a
    metric that gives one number of this output."""
    return metric_number(metric_call(metric, out, run, call), run, call, out)


def metric_call(metric: Callable[[Any], Any], out: Any, run: str, call: SweepCall) -> Any:
    """``metric(out)``; an exception of the metric's own refuses ``metric_invalid`` (chained)."""
    try:
        return metric(out)
    except TorchLensError:
        raise
    except Exception as exc:
        raise InputError(f"metric= raised on the {run} run's output: {type(exc).__name__}: "
                         f"{first_line(exc)}",
                         code="metric_invalid", teach=[call.with_metric(out)]) from exc


def metric_number(value: Any, run: str, call: SweepCall, out: Any) -> float:
    """What a metric gave on the output ``out``, as one finite number (``metric_value``)."""
    if isinstance(value, Tensor):
        if value.numel() != 1 or value.is_complex() or value.dtype == torch.bool:
            raise InputError(
                f"metric= gave a {str(value.dtype).removeprefix('torch.')} tensor of shape "
                f"{format_shape(value.shape)} on the {run} run's output; a sweep needs one "
                "real number a run (index one logit, or reduce)", code="metric_invalid",
                teach=[call.with_metric(out)])
        number = float(value.detach())
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
    else:
        raise InputError(f"metric= gave {type(value).__name__} on the {run} run's output, not "
                         "one number", code="metric_invalid", teach=[call.with_metric(out)])
    if not math.isfinite(number):
        raise InputError(f"metric= gave {number} on the {run} run's output, not a finite "
                         "number", code="metric_invalid", teach=[call.with_metric(out)])
    return number


def check_baselines(clean: float, corrupt: float, call: SweepCall, out: Any = None) -> None:
    """A sweep is normalised between the corrupt run (0) and the clean run (1): equal metrics
    leave nothing to normalise by, so the sweep refuses (``metric_baselines_equal``) before
    its cells run, instead of filling its grid with NaN."""
    if clean == corrupt or abs(clean - corrupt) <= 1e-6 * max(abs(clean), abs(corrupt)):
        raise InputError(
            f"metric= gives {clean:.6g} on the clean run and {corrupt:.6g} on the corrupt run: "
            "with nothing between them, no cell can be normalised (is the corrupt input the "
            "clean one, or does the metric not read what the inputs change?)",
            code="metric_baselines_equal",
            teach=[call.text("corrupt: an input whose metric differs from clean's"),
                   call.with_metric(out, "or a metric that tells the runs apart"),
                   "metric(model(clean)), metric(model(corrupt))  # check they differ"])


def _rows(model: nn.Module, inv: Any, texts: Any, call: SweepCall) -> list[str]:
    """Each site a glob expands to, once, in order."""
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InputTypeError(f"sites= takes site strings, not {texts!r}", code="option_invalid",
                             teach=[call.text(sites="['transformer.h.*']")])
    addresses = inv.addresses
    rows: dict[str, None] = {}
    for text in texts:
        for site in resolve(text, addresses, option="sites=", model_class=type(model).__name__,
                            code="edit_site_unknown",
                            example=lambda c: call.text(sites=repr([c]))):
            if site.kind in ("op", "name"):  # a transformer name is bound once inputs are known
                rows[site.text] = None
            else:
                rows[site.name if site.pass_num is None else
                     f"{site.name}:{site.pass_num}"] = None
    return list(rows)


AUTO_BATCH = 16  # cells a forward by default, where the model's rows are independent


def _one_row(bad: Any) -> bool:
    """The corrupt input has a batch dimension of one (so cells can be its rows)."""
    return all(t.dim() > 0 and t.shape[0] == 1 for t in leaves((bad.args, bad.kwargs), []))


def _check_inputs(good: Any, bad: Any, batch_size: int, call: SweepCall) -> None:
    a, b = leaves((good.args, good.kwargs), []), leaves((bad.args, bad.kwargs), [])
    if [tuple(t.shape) for t in a] != [tuple(t.shape) for t in b]:
        raise InputError(
            f"the clean and corrupt inputs differ in shape ({format_shapes(t.shape for t in a)} "
            f"vs {format_shapes(t.shape for t in b)}): a patch moves values between the same "
            "positions",
            code="patching_inputs_mismatch",
            teach=[call.text("clean and corrupt of one shape: pad or truncate both prompts to "
                             "the same number of tokens")])
    if batch_size > 1 and not _one_row(bad):
        raise InputError("batch_size > 1 repeats the corrupt input along its batch dimension, "
                         "which must be 1", code="option_invalid",
                         teach=[call.text(batch_size=1)])


def checked_positions(source: Any, rows: list[str], positions: Any,
                      call: SweepCall) -> list[int]:
    """``positions=`` checked against dimension 1 of every row's value (None: all of them;
    rows whose dimension 1 differs in length need ``positions=`` within the shortest)."""
    lengths = {row: _positions(source, row, call) for row in rows}
    length = min(lengths.values())
    if positions is None:
        if len(set(lengths.values())) > 1:
            shown = ", ".join(f"{row}: {n}" for row, n in list(lengths.items())[:4])
            raise InputError(f"the sites' values differ in the length of dimension 1 ({shown}"
                             f"{', ...' if len(lengths) > 4 else ''}), so there is no one set "
                             "of positions to sweep", code="option_invalid",
                             teach=[call.text(positions=range(length))])
        return list(range(length))
    if isinstance(positions, (str, bytes)) or not isinstance(positions, Iterable):
        raise InputTypeError(f"positions= takes an iterable of positions, not {positions!r}",
                             code="option_invalid", teach=[call.text(positions=range(length))])
    positions = list(positions)
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, int) or not -length <= p < length:
            raise InputError(f"positions= holds {p!r}, not a position of dimension 1 "
                             f"(length {length})", code="option_invalid",
                             teach=[call.text(positions=range(length))])
    if not positions:
        raise InputError("positions= is empty: a sweep needs a position to patch",
                         code="option_invalid", teach=[call.text(positions=range(length))])
    return positions


def _positions(source: Any, row: str, call: SweepCall) -> int:
    target = source[row]
    value = (target.calls[0] if hasattr(target, "calls") else target).out
    value = value[0] if isinstance(value, tuple) else value
    if value.dim() < 2:
        raise InputError(f"the value at {row!r} has shape {format_shape(value.shape)}: no "
                         "dimension 1 to sweep", code="option_invalid",
                         teach=[call.text("sites whose values have positions (dimension 1)",
                                          sites="[...]")])
    return value.shape[1]


def _run(model, inv, source, rows, positions, chunk, bad, metric, call) -> list[float]:
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
        return [metric_value(metric, out, "patched", call)]
    return [metric_value(metric, _row(out, r), "patched", call) for r in range(n)]


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
