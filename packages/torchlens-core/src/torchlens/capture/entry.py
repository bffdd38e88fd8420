"""The first step every surface shares before it captures: the refusals that need no forward,
the input ladder, and the capture pinned to eval + no-grad with the model's state restored."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from ..errors import CaptureError, InputError, InputTypeError, StateError, warn
from ..ladder import ABSENT, Resolution, resolve
from ..trace import Trace
from .boundaries import leaves
from .engine import capture, capturing
from .inference import ordinary, refuse_inference_parameters
from .inventory import Inventory, inventory
from .meta import check_inputs, refuse_values
from .policy import pinned, state_fingerprints, warm_up
from .seam import CaptureRequest, Part

LAZY_TEACH = [
    "with torch.no_grad(): model(x)  # materialize outside capture, then re-run the verb",
]


def checked_inventory(model: nn.Module, surface: str) -> Inventory:
    """The model's inventory, after the refusals that come before looking inside it: not a
    module, or a call from inside a forward being captured."""
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"tl.{surface} takes a torch.nn.Module, got {type(model).__name__}",
                             code="model_invalid", teach=[f"tl.{surface}(model, x)"])
    if capturing():
        raise CaptureError(
            f"tl.{surface} was called from inside a forward that TorchLens is already capturing",
            code="nested_trace",
            teach=["call it outside the model's forward",
                   "trace the outer model once and look up the inner module: trace['sub.module']"])
    return inventory(model)


def check_entry(model: nn.Module, surface: str, rung3: bool, inv: Inventory | None = None
                 ) -> Inventory:
    """Refusals that need no forward: not a module, nested capture, TorchScript, pending lazy state.
    Returns the model's inventory (``inv``: one the caller took with no forward since), for a
    capture that follows with no forward in between."""
    inv = inv or checked_inventory(model, surface)
    if inv.scripted:
        refuse_scripted(inv.scripted, surface)
    refuse_inference_parameters(model, inv.params, surface)
    lazy = inv.pending_lazy()
    buffers = [n for n, kind in lazy.items() if kind == "buffer"]
    if buffers:
        raise InputError(
            f"{type(model).__name__} has un-materialized lazy buffers {buffers[:3]}; tl.{surface} "
            "cannot use them before a first forward", code="lazy_uninitialized",
            teach=LAZY_TEACH)
    if rung3 and lazy:
        raise InputError(
            f"{type(model).__name__} has un-materialized lazy parameters {sorted(lazy)[:3]}: "
            "a lazy module accepts any width, so a probe would install its guess in your model",
            code="lazy_uninitialized",
            teach=LAZY_TEACH + [f"tl.{surface}(model, x)  # or pass the real input now"])
    return inv


def refuse_scripted(scripted: list[str], surface: str) -> None:
    """TorchScript runs its ops in its own interpreter, where no torch function mode sees them:
    a scripted model is refused, a scripted submodule is warned about."""
    if scripted[0] == "":
        raise InputTypeError(
            f"tl.{surface} got a TorchScript module: its ops run in TorchScript's interpreter, "
            "where TorchLens cannot see them", code="scripted_model",
            teach=[f"tl.{surface}(model, x)  # the nn.Module you passed to torch.jit.script"])
    warn("scripted_submodule",
         f"the TorchScript submodules {scripted[:5]} run their ops where TorchLens cannot see "
         "them: the trace shows each call without its ops, and what reads its outputs has no "
         "edge back to it. Trace the nn.Module they were scripted from to see their ops",
         stacklevel=None)


def pinned_capture(model: nn.Module, args: tuple, kwargs: dict, *, save: Any, surface: str,
                   warmup: bool = False, inv: Inventory | None = None,
                   parts: Sequence[Part] = ()) -> Trace:
    """One capture in eval + no-grad with state restored; the receipt rides on the trace.
    ``warmup``: one uncaptured forward first, inside the same pinning, so one-time setup is not
    timed as a layer's cost (disclosed in ``trace.meta["timing"]``). ``inv``: the model's
    inventory when the caller took it with no forward since."""
    inv = inv or inventory(model)
    with pinned(model, surface, inv=inv) as box:
        timing = warm_up(model, args, kwargs, inv) if warmup else None
        if timing and timing.get("warmup_forwards"):
            box["reset"]()  # the capture describes the call the caller would make next
        result = capture(CaptureRequest(model, args, kwargs, save=save, inventory=None if (
            timing and timing.get("warmup_forwards")) else inv), parts)
    result.receipt = box["receipt"]
    result.meta["receipt"] = box["receipt"].as_dict()
    if timing is not None:
        result.meta["timing"] = timing
    return result


def resolve_for(model: nn.Module, value: Any, *, input_kwargs: dict | None, input_shape: Any,
                surface: str, options: dict, probe=None, hints=None,
                needs_values: str | None = None, inv: Inventory | None = None) -> Resolution:
    """Entry checks, then the ladder: the shared first step of every surface.
    ``needs_values``: what the surface will keep that a meta model cannot have; ``inv``: the
    model's inventory when the caller took it (``checked_inventory``) with no forward since."""
    rung3 = value is ABSENT and input_shape is None and not input_kwargs
    inv = check_entry(model, surface, rung3, inv)
    if needs_values:
        refuse_values(model, surface, needs_values, inv)
    res = resolve(model, value, input_kwargs=input_kwargs, input_shape=input_shape,
                  surface=surface, options=options, probe=probe, hints=hints)
    check_inputs(model, res.args, res.kwargs, surface, inv)
    if any(t.is_inference() for t in leaves((res.args, res.kwargs), [])):
        res.args, res.kwargs = ordinary(res.args), ordinary(res.kwargs)
    if res.verified is None:  # no probe ran a forward since the check
        res.inventory = inv
    return res


def input_options(tokenizer: Any, processor: Any, preprocess: Any, labels: Any = None) -> dict:
    """The resolving options every surface hands the input ladder (and its plugins)."""
    return {"tokenizer": tokenizer, "processor": processor, "preprocess": preprocess,
            "labels": labels}


def check_baseline(previous: Trace, model: nn.Module) -> None:
    """An intervention-ready trace's model must still hold the bytes it had (``state_changed``
    names what moved); a trace without a baseline has nothing to check."""
    baseline = previous.meta.get("state_baseline")
    if not baseline:
        return
    now = state_fingerprints(model)
    changed = sorted(k for k in set(now) | set(baseline["tensors"])
                     if now.get(k) != baseline["tensors"].get(k))
    if changed:
        raise StateError(
            f"the model changed since this intervention-ready trace: {changed[:5]}"
            + (f" and {len(changed) - 5} more" if len(changed) > 5 else ""),
            code="state_changed",
            teach=["tl.trace(model, x, intervention_ready=True)  # a new baseline"])
