"""Rung 3: infer an input from static facts with at most ``MAX_PROBES`` pinned probes.

Candidates come from hints, plugins (``torchlens_shape_candidates``) and the model's first layer.
Each probe is one diary row. It first runs the forward on fake tensors (``budget.precheck``: no
allocation, the model's tensors untouched); a candidate that fails there, or whose peak memory or
FLOPs pass the disclosed budget (``provenance["probe_budget"]``), never runs for real. The one
that passes runs pinned (eval, no-grad, forked RNG, restored state); the first that runs is the
verified one and its result is what the surface consumes. A forward fake tensors cannot follow
runs for real under a guard that stops it before an op would pass the memory budget.

The bound: at most ``MAX_PROBES`` (8) probes per inference, failed or not, and no probe starts
after ``budget.MAX_SECONDS``. Candidates whose shape or recipe is refused statically are diary
rows too ("skipped") but run no forward.
Hints (``guess_input_shape(model, hints=...)``): ``shape`` (an input_shape value, tried first),
``batch``, ``image_size``, ``seq_len`` (positive ints that shape the core candidates).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..errors import InputError, InputTypeError, TorchLensError
from ..plugins import hook
from ..types import InputSpec
from . import budget as budgets
from .recipes import Recipe, _first_param_leaf, is_dtype_error, recipe_for
from .shapes import Slot, parse_input_shape
from .signature import ForwardSignature, forward_signature
from .synth import model_device, synthesize

MAX_PROBES = 8  # probes at most, failed or not, before inference refuses
HINT_KEYS = ("shape", "batch", "image_size", "seq_len")


@dataclass
class Inference:
    """The verified candidate: its slots, recipes, tensors, the probe's result and the diary."""

    candidate: Any
    slots: list[Slot]
    recipes: list[Recipe]
    args: tuple
    kwargs: dict
    result: Any
    diary: list[dict[str, Any]] = field(default_factory=list)
    budget: dict[str, Any] = field(default_factory=dict)


def core_candidates(model: nn.Module, sig: ForwardSignature, hints: dict) -> list[Any]:
    """Shapes suggested by the first parameterized layer, for single-input forwards only."""
    if len(sig.required) > 1 or (not sig.positional and not sig.var_positional):
        return []
    first = _first_param_leaf(model)
    if first is None:
        return []
    m, b = first[1], int(hints.get("batch", 1))
    sizes = [hints["image_size"]] if "image_size" in hints else [224, 32, 64, 28, 16, 96, 128, 256]
    seq = [hints["seq_len"]] if "seq_len" in hints else [16, 8]
    if isinstance(m, nn.Linear):
        return [(b, m.in_features), (b, 8, m.in_features)]
    if isinstance(m, nn.Conv2d):
        return [(b, m.in_channels, s, s) for s in sizes]
    if isinstance(m, nn.Conv1d):
        return [(b, m.in_channels, s) for s in (seq + [64, 128])]
    if isinstance(m, nn.Conv3d):
        return [(b, m.in_channels, 16, 112, 112), (b, m.in_channels, 8, 32, 32)]
    if isinstance(m, (nn.Embedding, nn.EmbeddingBag)):
        return [(b, s) for s in seq]
    if isinstance(m, nn.RNNBase):
        return [(b, seq[0], m.input_size) if m.batch_first else (seq[0], b, m.input_size)]
    if isinstance(m, nn.LayerNorm):
        return [(b, seq[0], *m.normalized_shape)]
    if isinstance(m, nn.modules.batchnorm._BatchNorm):
        extra = {"BatchNorm1d": [(), (16,)], "BatchNorm2d": [(32, 32)], "BatchNorm3d": [(8, 8, 8)]}
        return [(b, m.num_features, *e) for e in extra.get(type(m).__name__, [()])]
    return []


def candidates(model: nn.Module, sig: ForwardSignature, hints: dict) -> list[Any]:
    """Every candidate, most likely first, without duplicates: the hinted shape, core candidates
    shaped by size hints, plugin candidates, then the core's first-layer candidates."""
    found: list[Any] = []
    if "shape" in hints:
        found.append(hints["shape"])
    if any(k in hints for k in HINT_KEYS[1:]):  # the caller's sizes outrank plugin guesses
        found.extend(core_candidates(model, sig, hints))
    for group in hook().torchlens_shape_candidates(model=model):
        if group is not None and not isinstance(group, (list, tuple)):
            raise InputError(
                f"a torchlens_shape_candidates hook returned {type(group).__name__}; it must "
                "return a list of input_shape values", code="plugin_invalid",
                teach=["pip install -U <the plugin>", "tl.trace(model, input_shape=...)"])
        found.extend(group or [])
    found.extend(core_candidates(model, sig, hints))
    unique, seen = [], set()
    for c in found:
        key = json.dumps(_jsonable(c), sort_keys=True, default=repr)  # (1, 8) == [1, 8]
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return unique


def infer(model: nn.Module, probe: Callable[[tuple, dict], Any], hints: dict | None = None,
          surface: str = "trace") -> Inference:
    """Probe candidates in order; return the first verified one or refuse with the diary."""
    sig = forward_signature(model)
    hints = check_hints(hints, model, sig)
    diary: list[dict[str, Any]] = []
    device = model_device(model)
    budget = budgets.budget_for(device)
    started = time.perf_counter()
    probes = 0
    for candidate in candidates(model, sig, hints):
        if probes >= MAX_PROBES:
            break
        row: dict[str, Any] = {"probe": len(diary) + 1, "candidate": _jsonable(candidate)}
        diary.append(row)
        t0 = time.perf_counter()
        done = functools.partial(_done, row, t0)
        if t0 - started > budget["max_seconds"]:
            done("skipped", "probe_over_budget",
                 f"inference already took more than its {budget['max_seconds']:g} s budget")
            break
        try:
            slots = parse_input_shape(candidate, model, sig)
            recipes = [recipe_for(model, s, len(slots), sig) for s in slots]
        except TorchLensError as exc:
            if exc.code == "plugin_invalid":
                raise
            done("skipped", exc.code, exc.message[:300])
            continue
        probes += 1
        check = None
        if device.type != "meta":
            check = budgets.precheck(
                model, [(torch.Size(r.shape), r.dtype) for r in recipes],
                sum(not s.keyword for s in slots), [s.name for s in slots if s.keyword], budget)
            if check.outcome == "over_budget":
                done("skipped", "probe_over_budget", str(check.error)[:300],
                     precheck=check.facts())
                continue
            if check.outcome == "failed":
                done("failed", type(check.error).__name__, _first_line(check.error),
                     precheck=check.facts(), dtype_error=is_dtype_error(check.error))
                continue
        try:
            tensors = synthesize(recipes, device)
        except TorchLensError as exc:
            done("skipped", exc.code, exc.message[:300])
            continue
        args = tuple(t for s, t in zip(slots, tensors) if not s.keyword)
        kwargs = {s.name: t for s, t in zip(slots, tensors) if s.keyword}
        facts = {"precheck": check.facts()} if check is not None else {}
        try:
            if check is not None and check.outcome == "inconclusive":
                facts["guarded"] = _first_line(check.error)
                with budgets.guarded(budget):
                    result = probe(args, kwargs)
            else:
                result = probe(args, kwargs)
        except Exception as exc:  # a failed probe is a diary row, never a fall-through guess
            over = _over_budget(exc)
            if over is not None:
                done("skipped", "probe_over_budget", str(over)[:300], **facts)
            else:
                done("failed", getattr(exc, "code", type(exc).__name__), _first_line(exc),
                     dtype_error=is_dtype_error(exc.__cause__ or exc), **facts)
            continue
        done("verified", **facts)
        return Inference(candidate, slots, recipes, args, kwargs, result, diary, budget)
    raise _refusal(model, sig, diary, surface, budget)


def _done(row: dict, t0: float, outcome: str, code: str | None = None, error: str | None = None,
          **facts: Any) -> None:
    """Close one diary row: its outcome, error code and message, facts and time."""
    row.update(outcome=outcome, error_code=code, error=error, **facts,
               time_ms=round((time.perf_counter() - t0) * 1e3, 3))


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:300] if str(exc) else ""


def _over_budget(exc: BaseException) -> budgets.OverBudget | None:
    """The OverBudget behind a probe's error (a capture wraps what the forward raised)."""
    while exc is not None:
        if isinstance(exc, budgets.OverBudget):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def check_hints(hints: Any, model: nn.Module, sig: ForwardSignature) -> dict[str, Any]:
    """Refuse malformed hints before any probe: a hint is the caller's word, never skipped."""
    if hints is None:
        return {}
    teach = ["torchlens.debug.guess_input_shape(model, hints={'shape': (1, 3, 32, 32)})",
             "torchlens.debug.guess_input_shape(model, hints={'batch': 2, 'image_size': 64})"]
    if not isinstance(hints, Mapping):
        raise InputTypeError(f"hints= must be a dict, not {type(hints).__name__}",
                             code="input_shape_invalid", teach=teach)
    unknown = [k for k in hints if k not in HINT_KEYS]
    if unknown:
        raise InputError(f"hints={{{unknown[0]!r}: ...}}: unknown hint; known hints are "
                         f"{list(HINT_KEYS)}", code="input_shape_invalid", teach=teach)
    for key in HINT_KEYS[1:]:
        v = hints.get(key)
        if key in hints and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
            raise InputError(f"hints[{key!r}] = {v!r}: expected a positive int",
                             code="input_shape_invalid", teach=teach)
    if "shape" in hints:
        parse_input_shape(hints["shape"], model, sig)  # refuses input_shape_invalid as given
    return dict(hints)


def _refusal(model, sig, diary, surface, budget) -> InputError:
    verb = f"tl.{surface}" if surface != "debug" else "tl.trace"
    teach = [t for group in hook().torchlens_refusal_teach(model=model) for t in (group or [])]
    ambiguous = any(r.get("error_code") == "input_recipe_ambiguous" for r in diary)
    dtype = any(r.get("outcome") == "failed" and r.get("dtype_error") for r in diary)
    mapping = sig.spelled_mapping(spec=ambiguous or dtype)
    if dtype:  # a synthesized dtype was wrong: the override that names it comes first
        teach.insert(0, f"{verb}(model, input_shape={sig.spelled_mapping(spec=True)})  # say "
                        "each input's dtype and value range")
    teach += [
        f"{verb}(model, x)  # pass the real call",
        f"{verb}(model, input_shape={mapping})  # the mapping form, your forward's names",
        "torchlens.debug.guess_input_shape(model, hints={'shape': ..., 'batch': 1})  # probe "
        "with hints, no capture",
    ]
    tried = "; ".join(f"{r['candidate']}: {r['outcome']} ({r.get('error_code')})" for r in diary)
    err = InputError(
        f"could not infer an input for {type(model).__name__} from static facts "
        f"({len(diary)} candidate(s){': ' + tried if tried else ''})",
        code="input_inference_failed", teach=teach)
    err.diary = diary  # type: ignore[attr-defined]
    err.budget = budget  # type: ignore[attr-defined]
    return err


def _jsonable(candidate: Any) -> Any:
    if isinstance(candidate, InputSpec):
        return candidate.describe()
    if isinstance(candidate, dict):
        return {str(k): _jsonable(v) for k, v in candidate.items()}
    if isinstance(candidate, (list, tuple)):
        return [_jsonable(v) for v in candidate]
    return candidate
