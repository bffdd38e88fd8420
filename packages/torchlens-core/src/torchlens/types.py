"""Public value types: InputSpec (a synthesized-input override), ResolvedInput, DecodedOutput."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class InputSpec:
    """One synthesized input slot: its shape, and optionally the dtype and value bounds.

    Stands in for a shape anywhere ``input_shape=`` takes one; ``low``/``high`` bound the values
    (integers in ``[low, high)``, floats uniform in ``[low, high)``).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype | None = None
    low: float | int | None = None
    high: float | int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape) if isinstance(self.shape, (list, tuple))
                           else self.shape)

    def describe(self) -> dict[str, Any]:
        """JSON-safe facts for the provenance record."""
        return {"shape": list(self.shape),
                "dtype": str(self.dtype).removeprefix("torch.") if self.dtype else None,
                "low": self.low, "high": self.high}


@dataclass
class ResolvedInput:
    """What a resolver plugin makes of a real non-tensor input: the call plus provenance facts.

    ``facts`` is JSON-safe and lands in ``trace.provenance["resolver"]``; ``objects`` (e.g. the
    tokenizer) stay in memory on the trace for decoding and are never saved.
    """

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)
    objects: dict[str, Any] = field(default_factory=dict)


@dataclass
class DecodedOutput:
    """Output semantics of a gold trace: a one-line answer and a top-k table."""

    text: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""

    def __str__(self) -> str:
        return self.text
