"""tl.record: the selected ops' activations over one input or many, at close to forward cost.

A light capture labels every op exactly as ``tl.trace`` does but copies only what ``save=``
selects; values are stacked per label across inputs, optionally spilled to disk per batch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from .capture.engine import capture_selected
from .errors import InputError
from .ladder import ABSENT

SAVE_TEACH = ["tl.record(model, inputs, save=['conv2d_1', 'layer1'])",
              "tl.recording.dry_run(model, x, save=[...])  # see what would be recorded"]


class Recording:
    """Per-label activations over every recorded input: ``recording[label]``."""

    def __init__(self, labels: list[str], batches: list[dict[str, Any]] | None,
                 spill_dir: str | None, n_batches: int, provenance: list[dict]):
        self.labels = labels
        self._batches = batches
        self.spill_dir = spill_dir
        self.n_batches = n_batches
        self.provenance = provenance

    def _batch(self, i: int) -> dict[str, Any]:
        if self._batches is not None:
            return self._batches[i]
        return torch.load(os.path.join(self.spill_dir, f"batch-{i:06d}.pt"), weights_only=True)

    def __getitem__(self, label: str) -> torch.Tensor | list:
        """The label's activations over all inputs: concatenated along dim 0 when they fit,
        else a list (one entry per input)."""
        if label not in self.labels:
            raise InputError(f"{label!r} was not recorded; recorded: {self.labels[:8]}",
                             code="key_not_found", teach=[f"recording[{self.labels[0]!r}]"]
                             if self.labels else [])
        values = [self._batch(i)[label] for i in range(self.n_batches)]
        if all(isinstance(v, torch.Tensor) for v in values):
            shapes = {tuple(v.shape[1:]) for v in values}
            if len(shapes) == 1 and all(v.dim() > 0 for v in values):
                return torch.cat(values, dim=0)
        return values

    def __contains__(self, label: object) -> bool:
        return label in self.labels

    def __len__(self) -> int:
        return self.n_batches

    def __repr__(self) -> str:
        where = f", spilled to {self.spill_dir}" if self.spill_dir else ""
        return f"<Recording of {len(self.labels)} op(s) over {self.n_batches} input(s){where}>"


def _is_single(inputs: Any) -> bool:
    """One input (a tensor, args tuple, mapping, string, image) vs an iterable of inputs."""
    if isinstance(inputs, (torch.Tensor, str, bytes, tuple, Mapping)):
        return True
    module = type(inputs).__module__ or ""
    return module.startswith("PIL.") or module.startswith("numpy") or not isinstance(
        inputs, Iterable)


def record(model: nn.Module, inputs: Any, /, *, save: list[str], progress: bool | None = None,
           spill_dir: str | os.PathLike | None = None, tokenizer: Any = None,
           processor: Any = None, preprocess: Any = None) -> Recording:
    """Record the ``save=`` ops' activations over one input or an iterable of inputs (a
    DataLoader, a list of prompts). ``progress`` shows a bar on a terminal by default;
    ``spill_dir`` writes each batch to disk instead of holding it in memory."""
    from .verbs import resolve_for

    if isinstance(save, str) or not save or not all(isinstance(s, str) for s in save):
        raise InputError("tl.record needs save= as a non-empty list of op labels or module "
                         "addresses", code="save_selection_invalid", teach=SAVE_TEACH)
    items = [inputs] if _is_single(inputs) else inputs
    total = len(items) if hasattr(items, "__len__") else None
    if progress is None:
        progress = sys.stderr.isatty()
    if progress:
        from tqdm.auto import tqdm

        items = tqdm(items, total=total, desc="tl.record", unit="input")
    if spill_dir is not None:
        spill_dir = os.fspath(spill_dir)
        os.makedirs(spill_dir, exist_ok=True)
    options = {"tokenizer": tokenizer, "processor": processor, "preprocess": preprocess}
    batches: list[dict[str, Any]] = []
    provenance: list[dict] = []
    labels: list[str] = []
    n = 0
    for item in items:
        res = resolve_for(model, item, input_kwargs=None, input_shape=None, surface="record",
                          options=options)
        values = capture_selected(model, res.args, res.kwargs, save)
        if n == 0:
            labels = sorted(values, key=list(values).index)
            missing = [s for s in save if not any(k == s or k.startswith(f"{s}:") or
                                                  k.rpartition(":")[0] == s for k in values)]
            if missing:
                raise InputError(f"save= names {missing} that no op or module of this forward "
                                 "matches", code="save_selection_invalid", teach=SAVE_TEACH)
        provenance.append(res.provenance)
        if spill_dir is not None:
            torch.save(values, os.path.join(spill_dir, f"batch-{n:06d}.pt"))
        else:
            batches.append(values)
        n += 1
    return Recording(labels, None if spill_dir is not None else batches, spill_dir, n,
                     provenance)


def dry_run(model: nn.Module, x: Any = ABSENT, /, *, save: list[str], input_shape: Any = None,
            tokenizer: Any = None, processor: Any = None, preprocess: Any = None
            ) -> list[dict[str, Any]]:
    """Which ops ``save=`` would record, with their shapes and bytes per input: one metadata
    capture, no values stored."""
    from .verbs import trace

    result = trace(model, x, input_shape=input_shape, save=None, tokenizer=tokenizer,
                   processor=processor, preprocess=preprocess)
    rows = []
    for key in save:
        try:
            hit = result[key]
        except KeyError:
            raise InputError(f"save= names {key!r}, which this forward does not have",
                             code="save_selection_invalid", teach=SAVE_TEACH) from None
        if hasattr(hit, "calls"):
            ops = [result[call.output_ops[0]] for call in hit.calls if call.output_ops]
        elif hasattr(hit, "output_ops"):
            ops = [result[hit.output_ops[0]]]
        else:
            ops = [op for op in result if op.base_label == hit.base_label] if ":" not in key \
                else [hit]
        for op in ops:
            rows.append({"key": key, "label": op.label, "func": op.func, "shape": op.shape,
                         "dtype": op.dtype, "bytes": op.nbytes})
    return rows
