"""Models without values: parameters on the ``meta`` device (built under ``torch.device("meta")``,
``accelerate.init_empty_weights()`` or ``from_config`` on meta).

Shapes, dtypes, parameter counts and FLOPs need no values, so metadata captures run as usual;
whatever needs values asks here first and refuses typed. Tensors that accelerate offloads (its
hooks bring them in for each forward) are not meta models: they have values elsewhere.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import CaptureError, InputError, first_line
from ..units import format_shape

MATERIALIZE_TEACH = ("model = Model(config)  # build it on a real device (or "
                     "model.to_empty(device='cpu') and load weights), then call again")


def _offloaded(model: nn.Module) -> set[str]:
    """Modules whose tensors accelerate's hooks manage (they hold values elsewhere)."""
    return {name for name, mod in model.named_modules() if getattr(mod, "_hf_hook", None)}


def meta_tensors(model: nn.Module) -> list[str]:
    """Names of the parameters and buffers of a meta model: one whose every tensor is on
    ``meta`` (tensors an offloading hook backs with values aside). Empty for any other model,
    including one split over devices of which meta is one."""
    if not isinstance(model, nn.Module):
        return []  # the surface's own check refuses it
    tensors = [*model.named_parameters(), *model.named_buffers()]
    if not tensors or not any(t.is_meta for _, t in tensors):
        return []
    managed = _offloaded(model)
    own = [(n, t) for n, t in tensors
           if not any(n.startswith(f"{m}.") or not m for m in managed)]
    return [n for n, _ in own] if own and all(t.is_meta for _, t in own) else []


def is_meta(model: nn.Module) -> bool:
    """True for a meta model: every parameter and buffer on meta, with no values anywhere."""
    return bool(meta_tensors(model))


def _maybe_meta(model: nn.Module, inv: Any) -> bool:
    """A cheap first look from an inventory already taken: no meta tensor, no meta model."""
    return inv is None or inv.has_meta


def refuse_values(model: nn.Module, surface: str, what: str, inv: Any = None) -> None:
    """``meta_values_unavailable`` before any forward when ``what`` needs values (``inv``: the
    model's inventory, when the caller has it)."""
    names = meta_tensors(model) if _maybe_meta(model, inv) else []
    if not names:
        return
    raise InputError(
        f"{type(model).__name__} is on the meta device ({len(names)} parameters/buffers hold no "
        f"values, e.g. {names[0]!r}), so {what} cannot exist", code="meta_values_unavailable",
        teach=[f"tl.{surface}(model, input_shape=(...), save=None)  # shapes, FLOPs and bytes "
               "need no values" if surface == "trace" else
               "tl.summary(model, input_shape=(...))  # shapes, FLOPs and bytes need no values",
               MATERIALIZE_TEACH])


def check_inputs(model: nn.Module, args: tuple, kwargs: dict, surface: str, inv: Any = None
                 ) -> None:
    """A real (non-meta) tensor handed to a meta model: the values would be thrown away."""
    if not _maybe_meta(model, inv) or not is_meta(model):
        return
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and not value.is_meta:
            raise InputError(
                f"{type(model).__name__} is on the meta device but got a {value.device.type} "
                f"tensor of shape {format_shape(value.shape)}: a meta model computes shapes, not "
                "values",
                code="meta_values_unavailable",
                teach=[f"tl.{surface}(model, input_shape={tuple(value.shape)})  # the same shape, "
                       "made on the model's device", MATERIALIZE_TEACH])


# ops whose meta kernel takes one dtype only (Hugging Face's MoE experts run ``grouped_mm``)
_META_DTYPE = {"grouped_mm": "bfloat16"}


def op_unsupported(exc: BaseException, failure: dict[str, Any] | None, partial: Any
                   ) -> CaptureError:
    """An op that cannot run on meta: data-dependent (``nonzero``, a boolean mask, ``.item()``)
    or with no meta kernel for these dtypes."""
    where = ""
    func = "an op"
    if failure is not None:
        func = repr(failure["func"])
        where = f" in module {failure['module'] or '<model>'!r} (op #{failure['after_op'] + 1})"
    teach = ["build a smaller config of the same model (fewer layers or experts) on a real "
             "device and call again", MATERIALIZE_TEACH]
    dtype = _META_DTYPE.get(failure["func"]) if failure is not None else None
    if dtype is not None:
        teach.insert(0, f"model.to(torch.{dtype})  # torch's meta kernel for {failure['func']} "
                        f"takes {dtype} inputs only")
    err = CaptureError(
        f"{func}{where} cannot run on the meta device: it needs tensor values or has no meta "
        f"kernel for these inputs ({type(exc).__name__}: {first_line(exc, 160)}); "
        "everything before it is on "
        f"err.partial_trace ({len(partial) if partial is not None else 0} ops)",
        code="meta_op_unsupported", teach=teach)
    err.partial_trace = partial  # type: ignore[attr-defined]
    return err


def is_value_error(exc: BaseException) -> bool:
    """Errors torch raises when an op would need the values a meta tensor lacks."""
    text = str(exc)
    return isinstance(exc, (NotImplementedError, RuntimeError)) and (
        "meta" in text.lower() or "data-dependent" in text or "data-independent" in text)
