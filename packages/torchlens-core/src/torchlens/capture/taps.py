"""Taps: the part of a light capture, which keeps only the selected values of a forward and no
op records (``tl.record``'s rows, a patching sweep's edited forwards, attribution's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .engine import capture
from .seam import CaptureRequest, Part


class Taps(Part):
    """Keep ``request.save``'s values (op labels, module addresses, ``input_N``/``output_N``)
    as ``keep(key, value)`` makes them (default: a detached copy), in ``values``."""

    light = True

    def __init__(self, keep: Callable[[str, Any], Any] | None = None):
        self.keep = keep
        self.values: dict[str, Any] = {}

    def finish(self, trace: Any, session: Any) -> None:
        """Take the values the capture kept."""
        self.values = session.values


def edited_forward(model: Any, args: tuple, kwargs: dict, plan: Any, inv: Any = None) -> Any:
    """The model's output with ``plan``'s edits applied and nothing else kept: the lightest
    capture there is (module sites need no per-op mode at all). Every edit must fire."""
    trace = capture(CaptureRequest(model, args, kwargs, save=[], inventory=inv,
                                   keep_output=True), [plan, Taps()])
    return trace._objects["forward_output"]
