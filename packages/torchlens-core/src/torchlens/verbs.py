"""The public verbs. Each resolves its input through the ladder, then captures under its policy."""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from .capture import capture
from .storage import load_trace
from .trace import Trace

_ABSENT: Any = object()


def trace(model: nn.Module, input: Any = _ABSENT, /, *, input_kwargs: dict | None = None,
          input_shape: Any = None, save: Any = "all", intervention_ready: bool = False) -> Trace:
    """Record every op of ``model``'s forward on ``input`` (a tensor, a tuple of args, a mapping of
    forward keywords, or anything a plugin resolves)."""
    args, kwargs = _as_call(input, input_kwargs)
    return capture(model, args, kwargs, save=save, provenance={"origin": "gold"})


def _as_call(value: Any, input_kwargs: dict | None) -> tuple[tuple, dict]:
    from collections.abc import Mapping

    kwargs = dict(input_kwargs or {})
    if value is _ABSENT:
        return (), kwargs
    if isinstance(value, Mapping):
        return (), {**value, **kwargs}
    if isinstance(value, (tuple, list)):
        return tuple(value), kwargs
    return (value,), kwargs


def load(path: str | os.PathLike) -> Trace:
    """Read a trace written by ``Trace.save``."""
    return load_trace(path)
