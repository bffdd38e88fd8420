"""``tl.trace(..., compile=...)``: one compiled forward whose saved sites (and edits) live in its
graph, returned on the graph of the eager capture that placed them."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..capture.engine import capture, saves_nothing
from ..capture.inventory import Inventory
from ..capture.seam import CaptureRequest
from ..errors import InputError
from ..trace import Trace
from .run import CompiledRun


def refuse_compiled_trace(model: nn.Module, save: Any, save_grads: Any,
                          intervention_ready: bool) -> nn.Module:
    """What a compiled trace cannot do refuses before any forward; the model to capture (a
    compiled module keeps its addresses, ``_orig_mod.0``, as an eager trace gives them)."""
    if save == "all" or saves_nothing(save):
        raise InputError(f"compile= keeps the sites save= names inside the compiled graph; "
                         f"save={save!r} names none", code="option_invalid",
                         teach=["tl.trace(model, x, save=['blocks.*.hook_resid_post'], "
                                "compile=True)",
                                "tl.trace(model, x, save=['layer1', 'relu_3'], compile=True)"])
    if save_grads is not None:
        raise InputError("compile= runs one compiled forward; save_grads= needs the eager "
                         "capture's own autograd graph", code="option_invalid",
                         teach=["tl.trace(model, x, save=[...], save_grads=[...])  # eager"])
    if intervention_ready:
        raise InputError("compile= runs one compiled forward; intervention_ready=True needs the "
                         "eager capture's own records", code="option_invalid",
                         teach=["tl.trace(model, x, intervention_ready=True)  # eager"])
    return model


def compiled_trace(model: nn.Module, args: tuple, kwargs: dict, save: list[str], parts: list,
                   options: dict, inv: Inventory) -> Trace:
    """The trace of one compiled forward of ``model``: the eager graph, ``save``'s values."""
    run = CompiledRun(model, options, "trace", inv)
    try:
        runner = run.part(args, kwargs, list(save), parts, structure=True)
        result = capture(CaptureRequest(model, args, kwargs, save=list(save), inventory=inv),
                         [*parts, runner])
        run.checked(runner)
    finally:
        run.close()
    result.meta["compiled"] = run.describe()
    return result
