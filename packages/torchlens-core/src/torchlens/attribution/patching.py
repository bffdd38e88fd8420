"""Attribution patching: a patching sweep estimated to first order from one backward.

Patching the clean value ``c`` into the corrupt run at a site changes the metric by about
``(c - k) · ∂metric/∂k`` (``k`` the corrupt value): one clean forward, one corrupt forward and
one backward give every site and position at once, where the exact sweep runs a forward per
cell. The result is a ``PatchingSweep`` (normalised so the corrupt run is 0 and the clean run
1), so it can be set beside ``tl.patching.sweep``'s cell by cell.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from ..patching.grid import PatchingSweep, sweep_tokens
from ..patching.sweep import (
    SweepCall,
    check_baselines,
    checked_positions,
    metric_call,
    metric_number,
    metric_value,
    prepare,
)

SURFACE = "attribution.patching"


class AttributionPatching(PatchingSweep):
    """A patching sweep's grid estimated from gradients (``raw``: corrupt metric + estimate)."""

    title = "Attribution patching (first-order estimate)"


def _first(value: Any) -> torch.Tensor:
    return value[0] if isinstance(value, tuple) else value


def _at(trace: Any, site: str, what: str) -> torch.Tensor:
    target = trace[site]
    holder = target.calls[0] if hasattr(target, "calls") else target
    return _first(getattr(holder, what))


def patching(model: nn.Module, clean: Any, corrupt: Any, metric: Callable[[Any], Any] | None = None,
             /, *, sites: str | Iterable[str], positions: Iterable[int] | None = None,
             tokenizer: Any = None, processor: Any = None, preprocess: Any = None
             ) -> AttributionPatching:
    """Estimate ``tl.patching.sweep(model, clean, corrupt, sites=..., metric=...)`` from the
    gradient of ``metric`` in the corrupt run: per site (labels, modules, globs) and position
    of dimension 1, ``sum((clean - corrupt) * grad)`` over the other dimensions."""
    from ..verbs import trace

    call = SweepCall(SURFACE, sites)
    _, rows, good, _ = prepare(model, clean, corrupt, sites, metric, call, 1,
                               (tokenizer, processor, preprocess))
    with torch.no_grad():
        clean_metric = metric_value(metric, model(*good.args, **good.kwargs), "clean", call)
        source = trace(model, clean, save=rows, tokenizer=tokenizer, processor=processor,
                       preprocess=preprocess)
    with torch.enable_grad():
        run = trace(model, corrupt, save=rows, save_grads=rows, tokenizer=tokenizer,
                    processor=processor, preprocess=preprocess)
        target = metric_call(metric, run.output, "corrupt", call)
        corrupt_metric = metric_number(target, "corrupt", call, run.output)
        check_baselines(clean_metric, corrupt_metric, call, run.output)
        run.backward(target)
    positions = checked_positions(source, rows, positions, call)
    raw = torch.empty(len(rows), len(positions), dtype=torch.float64)
    for i, row in enumerate(rows):
        delta = (_at(source, row, "out").double() - _at(run, row, "out").double()) \
            * _at(run, row, "grad").double()
        per_position = delta.sum(dim=0)
        per_position = per_position.reshape(per_position.shape[0], -1).sum(dim=1)
        raw[i] = corrupt_metric + per_position[positions]
    return AttributionPatching(rows, positions, raw, clean_metric, corrupt_metric, 1, 3,
                               tokens=sweep_tokens(source, rows[0]))
