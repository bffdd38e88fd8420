"""Compare two runs op by op: ``tl.compare(a, b)`` matches the ops of two traces and says where
their values part, which op introduced the difference, and draws the diff.

``tl.compare(trace_a, trace_b)`` (or two trace files), ``tl.compare(model_a, model_b, x)`` (two
models on one input), ``tl.compare(model, x, y)`` (one model on two inputs).
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from ..errors import InputTypeError
from .comparison import ATOL, RTOL, Comparison, DiffRow

__all__ = ["Comparison", "DiffRow", "compare"]

ABSENT = object()
TEACH = ["tl.compare(trace_a, trace_b)", 'tl.compare("a.tlt", "b.tlt")',
         "tl.compare(model_a, model_b, x)", "tl.compare(model, x, y)"]


def _is_trace(value: Any) -> bool:
    from ..trace import Trace

    return isinstance(value, Trace) or isinstance(value, (str, os.PathLike))


def compare(a: Any, b: Any, x: Any = ABSENT, /, *, atol: float = ATOL, rtol: float = RTOL,
            save: Any = ABSENT, input_kwargs: dict | None = None, **trace_options: Any
            ) -> Comparison:
    """Match the ops of two runs and measure how their values differ.

    Two Traces or trace files compare as they are. ``(model_a, model_b, x)`` traces both models
    on ``x``; ``(model, x, y)`` traces one model on ``x`` and on ``y`` (each input through the
    input ladder; ``save=``, default "all", and other ``tl.trace`` options apply to both).
    ``atol``/``rtol``: the tolerance values are judged by (``torch.testing``'s float32
    defaults). Traces of different models refuse nothing: the ops one side lacks are the
    answer.
    """
    from ..verbs import load, trace

    if atol < 0 or rtol < 0:
        raise InputTypeError(f"atol={atol!r} and rtol={rtol!r} must be >= 0",
                             code="option_invalid", teach=["tl.compare(a, b, atol=1e-4)"])
    if save is not ABSENT:
        trace_options["save"] = save
    if x is ABSENT and _is_trace(a) and _is_trace(b) and not trace_options and \
            input_kwargs is None:
        ta = a if not isinstance(a, (str, os.PathLike)) else load(a)
        tb = b if not isinstance(b, (str, os.PathLike)) else load(b)
        return Comparison(ta, tb, atol=atol, rtol=rtol)
    options = {"save": "all", **trace_options, "input_kwargs": input_kwargs}
    if isinstance(a, nn.Module) and isinstance(b, nn.Module) and x is not ABSENT:
        return Comparison(trace(a, x, **options), trace(b, x, **options), atol=atol,
                          rtol=rtol, names=("model_a", "model_b"))
    if isinstance(a, nn.Module) and not isinstance(b, nn.Module) and x is not ABSENT:
        return Comparison(trace(a, b, **options), trace(a, x, **options), atol=atol,
                          rtol=rtol, names=("x", "y"))
    kinds = ", ".join(type(v).__name__ for v in (a, b, x) if v is not ABSENT)
    raise InputTypeError(
        f"tl.compare takes two traces (or trace files), two models and an input, or one model "
        f"and two inputs; it was given ({kinds})" + (
            "; tracing options apply only when compare runs the models" if trace_options
            or input_kwargs is not None else ""),
        code="compare_input_invalid", teach=TEACH)
