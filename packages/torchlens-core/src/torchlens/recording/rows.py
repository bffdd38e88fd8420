"""Selected values into rows: one per example, padded positions dropped, reduced and cast.

The keeper runs inside the captured forward, on the live value, so only what is stored is
ever copied: a reduction (``"mean"``/``"last"`` over the sequence, or a callable), the real
tokens under an attention mask, then the cast to the stored dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..capture.recorder import snapshot
from ..errors import InputError
from ..sites import function_of, name_of

REDUCTIONS = ("mean", "last")
REDUCE_TEACH = ["tl.record(model, inputs, save=['h.0'], reduce='mean')",
                "tl.record(model, inputs, save=['h.0', 'h.1'], reduce={'h.0': 'last'})",
                "tl.record(model, inputs, save=['h.0'], reduce=lambda t: t.amax(dim=1))"]


@dataclass
class Rows:
    """One label's rows of one batch: ``units`` stacked, ``lengths`` per example when ragged
    (each example's real tokens, flat along the sequence)."""

    units: torch.Tensor
    lengths: torch.Tensor | None = None


def entry_of(key: str, save: list[str]) -> str | None:
    """The ``save=`` entry a recorded key (``linear_2``, ``cell:3``) came from."""
    for entry in save:
        if key == entry or name_of(key) == entry:
            return entry
    base = function_of(key)
    return base if base in save else None


def check_reduce(reduce: Any, save: list[str]) -> None:
    """Refuse a ``reduce=`` that names no selected label or no known reduction."""
    specs = reduce.items() if isinstance(reduce, Mapping) else [(None, reduce)]
    for entry, spec in specs:
        if entry is not None and entry not in save:
            raise InputError(f"reduce= names {entry!r}, which save= does not select",
                             code="option_invalid", teach=REDUCE_TEACH)
        if spec is not None and not callable(spec) and spec not in REDUCTIONS:
            raise InputError(f"reduce={spec!r}: use 'mean', 'last' or a callable on the "
                             "batched tensor", code="option_invalid", teach=REDUCE_TEACH)


def describe_reduce(reduce: Any) -> Any:
    """JSON-safe words for ``reduce=`` (a callable by its qualified name)."""
    if isinstance(reduce, Mapping):
        return {k: describe_reduce(v) for k, v in sorted(reduce.items())}
    if callable(reduce):
        return f"callable:{getattr(reduce, '__module__', '')}." \
               f"{getattr(reduce, '__qualname__', type(reduce).__name__)}"
    return reduce


def _reduce(value: torch.Tensor, how: Any, mask: torch.Tensor | None) -> torch.Tensor:
    if callable(how):
        return how(value)
    over = mask is not None and value.shape[:2] == mask.shape
    if how == "mean":
        if not over:
            return value.mean(dim=1)
        weights = mask.to(value.dtype).reshape(*mask.shape, *([1] * (value.dim() - 2)))
        return (value * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)
    if not over:  # "last"
        return value[:, -1]
    positions = torch.arange(mask.shape[1], device=mask.device)
    last = (mask.to(torch.long) * positions).argmax(dim=1)
    return value[torch.arange(value.shape[0], device=value.device), last]


class Keeper:
    """The per-batch callback a light capture calls with each selected value."""

    def __init__(self, save: list[str], reduce: Any, dtype: torch.dtype | None,
                 mask: torch.Tensor | None, as_rows: bool):
        self.save, self.reduce, self.dtype = save, reduce, dtype
        self.mask, self.as_rows = mask, as_rows
        self.keep = None if mask is None else mask.to(torch.bool)
        self.unpadded = self.keep is not None and bool(self.keep.all())

    def how(self, key: str) -> Any:
        if isinstance(self.reduce, Mapping):
            return self.reduce.get(entry_of(key, self.save))
        return self.reduce

    def __call__(self, key: str, value: Any, owned: bool = False) -> Any:
        """``value`` as a row keeps it; ``owned``: the capture's own copy, which the row may
        hold as it is (a view of the forward's tensor is copied)."""
        if not isinstance(value, torch.Tensor):
            # several outputs: a copy of each, as for one (the store refuses them by name)
            return snapshot(value)
        out = value.detach()
        how = self.how(key)
        if how is not None and out.dim() >= 2:
            out = _reduce(out, how, self.mask)
        lengths = None
        if self.as_rows and self.mask is not None and out.shape[:2] == self.mask.shape:
            lengths = self.keep.sum(dim=1)
            # no padding: every token is real, so a reshape stands for the gather
            out = out.flatten(0, 1) if self.unpadded else out[self.keep]
        if self.dtype is not None:
            out = out.to(self.dtype)
        if out.data_ptr() == value.data_ptr() and not (owned and out.numel() == value.numel()):
            out = out.clone()
        return Rows(out, lengths) if self.as_rows else out


def batch_rows(args: tuple, kwargs: dict) -> tuple[int, torch.Tensor | None]:
    """The examples in one call (its batch dimension) and its attention mask, if any."""
    mask = kwargs.get("attention_mask")
    if not (isinstance(mask, torch.Tensor) and mask.dim() == 2):
        mask = None
        for value in args:
            if isinstance(value, Mapping) and isinstance(value.get("attention_mask"),
                                                         torch.Tensor):
                mask = value["attention_mask"]
    if mask is not None:
        return int(mask.shape[0]), mask
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0]), None
    return 1, None


Reduce = str | Callable[[torch.Tensor], torch.Tensor] | Mapping[str, Any] | None
