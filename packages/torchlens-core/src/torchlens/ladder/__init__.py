"""The input ladder: a real input XOR ``input_shape=`` XOR nothing, with a provenance record.

``resolve`` is the one resolver every surface uses. Rung 3 returns the verified probe's result so
the surface consumes it instead of capturing again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from ..errors import CaptureError, InputError, InputTypeError, TorchLensError, add_note
from ..units import format_shape
from . import provenance as prov
from .infer import MAX_PROBES, Inference, infer
from .real import resolve_real
from .recipes import is_dtype_error, recipe_for
from .shapes import parse_input_shape
from .signature import forward_signature
from .synth import model_device, synthesize

ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "<absent>"})()

__all__ = ["ABSENT", "MAX_PROBES", "Inference", "Resolution", "forward_errors", "infer",
           "resolve"]


@dataclass
class Resolution:
    """The call a surface runs, its provenance, and (rung 3) the verified probe's result."""

    args: tuple
    kwargs: dict
    provenance: dict[str, Any]
    objects: dict[str, Any] = field(default_factory=dict)
    verified: Any = None
    given: str = ""  # the type name of the caller's real input, for error hints
    inventory: Any = None  # the model's inventory from the entry check (capture reuses it)


def resolve(model: nn.Module, value: Any = ABSENT, *, input_kwargs: dict | None = None,
            input_shape: Any = None, surface: str = "trace",
            options: dict[str, Any] | None = None,
            probe: Callable[[tuple, dict], Any] | None = None,
            hints: dict | None = None) -> Resolution:
    """Pick the rung, refuse conflicts before any forward, and build the call plus provenance."""
    if not isinstance(model, nn.Module):
        raise InputTypeError(
            f"tl.{surface} takes a torch.nn.Module, got {type(model).__name__}",
            code="model_invalid", teach=[f"tl.{surface}(model, x)  # model: an nn.Module"])
    has_real = value is not ABSENT
    if input_shape is not None and (has_real or input_kwargs):
        given = "a real input" if has_real else "input_kwargs="
        raise InputError(
            f"tl.{surface} got {given} AND input_shape=; the rungs are exclusive",
            code="input_rung_conflict",
            teach=[f"tl.{surface}(model, x)  # keep the real input (best)",
                   f"tl.{surface}(model, input_shape=...)  # or only the declared shape"])
    if input_kwargs is not None and not (isinstance(input_kwargs, dict) and all(
            isinstance(k, str) for k in input_kwargs)):
        raise InputTypeError(
            f"input_kwargs= must map forward keyword names to values, got {input_kwargs!r}",
            code="input_unresolved", teach=[f"tl.{surface}(model, x, input_kwargs={{'mask': m}})"])
    options = {k: v for k, v in (options or {}).items() if v is not None}
    if has_real or input_kwargs:
        real = resolve_real(model, value if has_real else (), input_kwargs, surface, options)
        record = prov.gold(surface, real.args, real.kwargs, real.facts or None)
        return Resolution(real.args, real.kwargs, record, real.objects,
                          given=type(value).__name__ if has_real else "")
    if input_shape is not None:
        sig = forward_signature(model)
        slots = parse_input_shape(input_shape, model, sig)
        recipes = [recipe_for(model, s, len(slots), sig) for s in slots]
        tensors = synthesize(recipes, model_device(model))
        args = tuple(t for s, t in zip(slots, tensors) if not s.keyword)
        kwargs = {s.name: t for s, t in zip(slots, tensors) if s.keyword}
        record = prov.synthesized("declared", surface, slots, recipes, [], "input_shape")
        return Resolution(args, kwargs, record)
    if probe is None:
        raise InputError(f"tl.{surface} needs an input", code="input_inference_failed")
    found = infer(model, probe, hints, surface)
    record = prov.synthesized("inferred", surface, found.slots, found.recipes, found.diary,
                              "inference", found.budget)
    return Resolution(found.args, found.kwargs, record, verified=found.result)


@contextlib.contextmanager
def forward_errors(res: Resolution, surface: str = "trace") -> Iterator[None]:
    """Wrap a surface's forward. A declared-shape call that raises refuses typed
    (``forward_failed``) naming the declared shape -- never falling through to inference; a real
    list input that raises gets a note on how to pass a list as one argument."""
    try:
        yield
    except Exception as exc:
        if res.given == "list" and not isinstance(exc, TorchLensError):
            add_note(exc, f"torchlens: a list input is passed as positional arguments "
                          f"(model(*x)); to pass the list itself as one argument, wrap it: "
                          f"tl.{surface}(model, (x,))")
        if res.provenance.get("origin") != "declared" or isinstance(exc, TorchLensError):
            raise
        shapes = ", ".join(f"{s['slot']}: {format_shape(s['shape'])} {s['dtype']} {s['recipe']}"
                           for s in res.provenance["slots"])
        teach = [f"tl.{surface}(model, x)  # pass the real call",
                 f"tl.{surface}(model, input_shape=...)  # a shape this forward accepts",
                 "torchlens.debug.guess_input_shape(model, hints={'batch': 1})  # probe, no "
                 "capture"]
        if is_dtype_error(exc):  # the synthesized dtype was wrong: name the override first
            teach.insert(0, f"tl.{surface}(model, input_shape={_spec_spelling(res)})  # say "
                            "the dtype and value range")
        err = CaptureError(
            f"the forward raised on the declared input_shape= input ({shapes}): "
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}; "
            "TorchLens does not fall back to inference",
            code="forward_failed", teach=teach)
        err.partial_trace = getattr(exc, "partial_trace", None)  # type: ignore[attr-defined]
        raise err from exc


def _spec_spelling(res: Resolution) -> str:
    """The declared input_shape= respelled with InputSpec for every slot."""
    specs = [(s["slot"], s["keyword"], "torchlens.types.InputSpec("
              f"{tuple(s['shape'])}, dtype=..., low=..., high=...)")
             for s in res.provenance["slots"]]
    if any(keyword for _, keyword, _ in specs):
        return "{" + ", ".join(f"{name!r}: {spec}" for name, _, spec in specs) + "}"
    return specs[0][2] if len(specs) == 1 else "[" + ", ".join(s for _, _, s in specs) + "]"
