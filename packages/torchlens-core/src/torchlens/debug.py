"""Debug helpers for the input ladder: guess an input without capturing, explain a trace.

``guess_input_shape(model, hints=...)`` runs the same rung-3 inference as ``tl.trace(model)``,
but each probe is a plain forward pinned to eval + no-grad (RNG forked, modes and buffers
restored) -- never a capture. ``resolve_input`` shows the call a verb would make for an input,
resolved exactly as ``tl.trace`` resolves it. ``explain(trace)`` says in plain words where a
trace's input came from and what that means.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from .capture.engine import capturing
from .capture.inference import outside_inference_mode
from .capture.policy import pending_lazy, pinned
from .errors import CaptureError, InputError, InputTypeError
from .ladder import ABSENT, MAX_PROBES, Resolution, infer, resolve
from .units import format_shape

__all__ = ["MAX_PROBES", "Guess", "explain", "guess_input_shape", "resolve_input"]


@dataclass
class Guess:
    """What inference found: an ``input_shape=`` value, the slots' recipes and the probe diary."""

    input_shape: Any
    recipes: list[dict[str, Any]] = field(default_factory=list)
    diary: list[dict[str, Any]] = field(default_factory=list)

    def __repr__(self) -> str:
        return (f"Guess(input_shape={self.input_shape!r}, "
                f"{len(self.recipes)} slot(s), {len(self.diary)} probe(s))")


def _check(model: Any) -> None:
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"guess_input_shape takes a torch.nn.Module, got "
                             f"{type(model).__name__}", code="model_invalid",
                             teach=["torchlens.debug.guess_input_shape(model)"])
    if capturing():
        raise CaptureError("guess_input_shape was called from inside a forward TorchLens is "
                           "capturing", code="nested_trace",
                           teach=["call it outside the model's forward"])
    lazy = pending_lazy(model)
    if lazy:
        raise InputError(
            f"{type(model).__name__} has un-materialized lazy tensors {sorted(lazy)[:3]}: a lazy "
            "module accepts any width, so a probe would install its guess in your model",
            code="lazy_uninitialized",
            teach=["with torch.no_grad(): model(x)  # materialize outside capture, then re-run"])


@outside_inference_mode
def guess_input_shape(model: nn.Module, hints: dict | None = None) -> Guess:
    """Infer an input for ``model`` with at most ``MAX_PROBES`` pinned plain forwards.

    ``hints``: ``shape`` (an input_shape value to try first), ``batch``, ``image_size``,
    ``seq_len``. Returns a :class:`Guess` whose ``input_shape`` can be passed straight to
    ``tl.trace(model, input_shape=...)``; refuses ``input_inference_failed`` (with ``.diary``)
    when no candidate runs. Nothing is captured and the model's state is left as it was.
    """
    _check(model)

    def probe(args: tuple, kwargs: dict) -> Any:
        with pinned(model, "debug"):
            return model(*args, **kwargs)

    found = infer(model, probe, hints, surface="debug")
    recipes = [{"slot": s.name, "keyword": s.keyword, **r.describe()}
               for s, r in zip(found.slots, found.recipes)]
    return Guess(found.candidate, recipes, found.diary)


@outside_inference_mode
def resolve_input(model: nn.Module, input: Any = ABSENT, /, *, input_kwargs: dict | None = None,
                  input_shape: Any = None, hints: dict | None = None, tokenizer: Any = None,
                  processor: Any = None, preprocess: Any = None) -> Resolution:
    """The call (``args``, ``kwargs``) and provenance a verb would use for this input, resolved
    exactly as ``tl.trace`` resolves it (a string or image goes through the same plugins). On
    rung 3 the probes are plain pinned forwards, as in :func:`guess_input_shape`."""
    if input is ABSENT and input_shape is None and not input_kwargs:
        _check(model)

    def probe(args: tuple, kwargs: dict) -> Any:
        with pinned(model, "debug"):
            return model(*args, **kwargs)

    options = {"tokenizer": tokenizer, "processor": processor, "preprocess": preprocess}
    res = resolve(model, input, input_kwargs=input_kwargs, input_shape=input_shape,
                  surface="trace", options=options, probe=probe, hints=hints)
    res.verified = None  # a plain forward's output, not a capture
    return res


def _shape(s: dict[str, Any]) -> str:
    return format_shape(s.get("shape"))


def explain(trace: Any) -> str:
    """Where this trace's input came from and what that means, in plain words."""
    p = trace.provenance or {}
    origin = p.get("origin", "gold")
    lines = [{
        "gold": "Input: gold -- you passed the real input; TorchLens synthesized nothing. (Gold "
                "does not certify that the data is meaningful.)",
        "declared": "Input: declared -- the shape came from input_shape=; the VALUES are random, "
                    "synthesized by TorchLens.",
        "inferred": "Input: inferred -- TorchLens inferred the shape by probing the model and "
                    "synthesized random VALUES.",
    }.get(origin, f"Input: {origin}.")]
    for s in p.get("slots") or []:
        name = f"keyword {s['slot']!r}" if s.get("keyword") else f"input {s['slot']}"
        text = f"  {name}: {s.get('kind', 'tensor')} {_shape(s)} {s.get('dtype') or ''}".rstrip()
        if s.get("recipe") == "caller":
            text += ", given by you"
        else:
            text += f", values {s.get('recipe')} in [{s.get('low')}, {s.get('high')})"
            if s.get("source"):
                text += f" -- because {s['source']}"
        lines.append(text)
    if p.get("seed") is not None:
        lines.append(f"Values: seed {p['seed']} from a local generator ({p.get('generator')}); "
                     "your global RNG was not advanced and the model was not moved.")
    diary = p.get("probe_diary") or []
    if diary:
        lines.append(f"Probe diary ({len(diary)} row(s), at most {MAX_PROBES} probes, each checked "
                     "on fake tensors before any real forward):")
        budget = p.get("probe_budget") or {}
        if budget.get("memory_bytes") is not None:
            lines.append(f"  budget: {budget['memory_bytes'] / 1e9:.2f} GB of memory "
                         f"({budget['memory_fraction']:.0%} of {budget['memory_source']}), "
                         f"{budget.get('max_flops') or 0:.0e} FLOPs, {budget['max_seconds']:g} s")
        for r in diary:
            err = f" [{r['error_code']}: {r.get('error')}]" if r.get("error_code") else ""
            lines.append(f"  #{r.get('probe')} {r.get('candidate')}: {r.get('outcome')}{err} "
                         f"({r.get('time_ms')} ms)")
    if p.get("recapture"):
        rc = p["recapture"]
        lines.append(f"Recapture: once, from the inferred input -- {rc.get('reason')} "
                     f"(policy: {rc.get('policy')}).")
    if p.get("resolver"):
        facts = ", ".join(f"{k}={v!r}" for k, v in p["resolver"].items())
        lines.append(f"Resolver: {facts}")
    if origin != "gold":
        lines.append(
            "What this proves: this exact synthesized call ran under the stated execution policy "
            "and its capture verified. It does not prove canonical preprocessing, representative "
            "values, a stable graph for other data, or another input's control-flow path.")
        lines.append(
            "Guardrails: decode_output() and output_table() refuse "
            "(nongold_semantics_unavailable); the first raw value read warns once per trace "
            "(nongold_raw_value_read). Structure, shapes, parameters and costs are first-class.")
    receipt = (getattr(trace, "meta", None) or {}).get("receipt")
    if receipt:
        from .capture.policy import Receipt

        r = Receipt(**receipt)
        state = f"verified {r.scope}" if r.verified else "NOT verified"
        undone = f" ({r.undone})" if r.undone else ""
        lines.append(f"State: pinned {r.pinned.get('mode', 'eval')} + no-grad; "
                     f"restoration {state}{undone}.")
    advisories = (getattr(trace, "annotations", None) or {}).get("capture_advisories") or []
    if advisories:
        lines.append(f"Advisories ({len(advisories)}):")
        for a in advisories:
            if isinstance(a, dict):
                code = a.get("code", "advisory")
                rest = a.get("message") or ", ".join(f"{k}={v!r}" for k, v in a.items()
                                                      if k != "code")
                lines.append(f"  {code}: {rest}")
            else:
                lines.append(f"  {a}")
    else:
        lines.append("Advisories: none.")
    return "\n".join(lines)
