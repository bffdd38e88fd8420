"""Gradients of any site: ``tl.trace(model, x, save_grads=sites, grad_edits={site: edit})``
notes where gradients will be read as the forward runs (through the recorder's seam), and
``trace.backward(target)`` computes them in one backward; ``trace[site].grad`` and
``trace.grads`` read them."""

from __future__ import annotations

from .backward import GradError, GradState, run_backward
from .graph import backward_trace
from .observer import GradObserver
from .table import GradTable

__all__ = ["GradError", "GradObserver", "GradState", "GradTable", "backward_trace", "run_backward"]
