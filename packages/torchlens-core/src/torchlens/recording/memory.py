"""An in-memory recording: each input's selected values, stacked per label on demand."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError


class Recording:
    """Per-label activations over every recorded input: ``recording[label]``."""

    def __init__(self, labels: list[str], batches: list[dict[str, Any]],
                 provenance: list[dict]):
        self.labels = labels
        self._batches = batches
        self.n_batches = len(batches)
        self.provenance = provenance

    def __getitem__(self, label: str) -> torch.Tensor | list:
        """The label's activations over all inputs: concatenated along dim 0 when they fit,
        else a list (one entry per input)."""
        if label not in self.labels:
            raise InputError(f"{label!r} was not recorded; recorded: {self.labels[:8]}",
                             code="key_not_found", teach=[f"recording[{self.labels[0]!r}]"]
                             if self.labels else [])
        values = [batch[label] for batch in self._batches]
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
        return f"<Recording of {len(self.labels)} op(s) over {self.n_batches} input(s)>"
