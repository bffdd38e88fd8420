"""The public verbs. Each resolves its input through the ladder, then captures under its policy.

``tl.trace`` is the power surface (keeps the caller's modes); pinned surfaces capture in eval +
no-grad and restore state, verified by a receipt.
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from . import sharded
from .anatomy import Names, bind_request, has_names
from .capture.engine import capture, parse_save, saves_nothing
from .capture.entry import (
    LAZY_TEACH,
    check_baseline,
    checked_inventory,
    input_options,
    pinned_capture,
    resolve_for,
)
from .capture.inference import outside_inference_mode
from .capture.policy import pinned, state_fingerprints, state_hash
from .capture.seam import CaptureRequest
from .compiling import compile_options, compiled_trace, refuse_compiled_trace
from .edits.plan import EditPlan, plan_edits
from .edits.push import TemplateKeeper
from .errors import InputTypeError, StateError, TorchLensError, warn
from .grads.plan import needing_grad, plan_grads
from .grads.targets import summed_output
from .ladder import ABSENT, forward_errors
from .ladder.budget import check_save_budget
from .plugins import hook
from .storage import load_trace
from .summary import Summary
from .trace import Trace
from .viz import render_drawing, validate_options

_bn_warned = False


@outside_inference_mode
def rerun(previous: Trace, input: Any, /, *, input_kwargs: dict | None = None,
          **options: Any) -> Trace:
    """``Trace.run``: trace the same model on a new real input with the previous trace's capture
    options; an intervention-ready trace first checks the model against its state baseline."""
    model = previous._objects["model"]
    check_baseline(previous, model)
    saved = previous.meta.get("options", {})
    options.setdefault("save", saved.get("save", "all"))
    options.setdefault("intervention_ready", bool(saved.get("intervention_ready")))
    options.setdefault("edits", previous._objects.get("edits"))
    options.setdefault("allow_unfired", bool(saved.get("allow_unfired")))
    return trace(model, input, input_kwargs=input_kwargs, **options)


@outside_inference_mode
def trace(model: nn.Module, input: Any = ABSENT, /, *, input_kwargs: dict | None = None,
          input_shape: Any = None, save: Any = "all", intervention_ready: bool = False,
          tokenizer: Any = None, processor: Any = None, preprocess: Any = None,
          labels: Any = None, edits: Any = None, allow_unfired: bool = False,
          save_grads: Any = None, grad_edits: Any = None, compile: Any = False) -> Trace:
    """Record every op of ``model``'s forward on a real input, a declared shape, or nothing.

    ``input`` is a tensor, a tuple of positional args, a mapping of forward keywords, or anything
    a plugin resolves (a prompt string, a PIL image). ``save`` is "all", None or a list of op
    labels / module addresses / module globs. Keeps the caller's train/eval and grad modes.
    ``edits={site: edit}`` (``tl.edits``) changes the forward where each site's value is made;
    ``trace.edits`` proves each fired, and a site that never fired refuses unless
    ``allow_unfired=True``. ``intervention_ready=True`` keeps a state baseline (checked by
    ``trace.run``) and, with ``save="all"``, each op's call, for ``trace.push(edits)``.
    ``save_grads=`` ("all" or sites, as ``save=``) notes where gradients will be read, for
    ``trace.backward(target)``; ``grad_edits={site: edit}`` change the gradient there.
    ``compile=True`` (or torch.compile's keywords, as ``tl.record``'s) runs the forward
    compiled, the ``save=`` sites' values and the edits inside the compiled graph, on the graph
    of one eager capture of the same input signature (kept); ``trace.meta["compiled"]`` says
    how it compiled and how far each site is from the eager value.
    """
    compiling = compile_options(compile, model, "trace") if compile else None
    if compiling is not None:
        model = refuse_compiled_trace(model, save, save_grads, intervention_ready)
    inv = checked_inventory(model, "trace")
    # transformer names are bound below, once the input is resolved
    names = has_names(save, edits, inv) or has_names(save_grads, grad_edits, inv)
    if not names:
        parse_save(save, model, inv)
        plan = plan_edits(edits, inv, model, allow_unfired, "trace")
        grads = plan_grads(save_grads, grad_edits, inv, model)
    # what trace.push recomputes from: each op's call
    keeper = TemplateKeeper() if intervention_ready and save == "all" else None
    if intervention_ready and inv.lazy:
        raise StateError(
            "intervention_ready=True needs a state baseline, but "
            f"{sorted(inv.lazy)[:3]} are pending lazy parameters with no bytes to "
            "witness",
            code="state_baseline_unavailable", teach=LAZY_TEACH)
    needs_values = None
    if not saves_nothing(save) or intervention_ready:
        needs_values = f"save={save!r} (activation values)" if not saves_nothing(save) else \
            "intervention_ready=True (a state baseline)"
    res = resolve_for(
        model, input, input_kwargs=input_kwargs, input_shape=input_shape, surface="trace",
        needs_values=needs_values, options=input_options(tokenizer, processor, preprocess, labels),
        probe=lambda a, k: pinned_capture(model, a, k, save=None, surface="trace"), inv=inv)
    named = None
    if names:
        save, sites, named = bind_request(model, res.args, res.kwargs, inv, save, edits)
        grad_save, grad_sites, grad_named = bind_request(model, res.args, res.kwargs, inv,
                                                         save_grads, grad_edits)
        parse_save(save, model, inv)
        plan = plan_edits(edits, inv, model, allow_unfired, "trace", named=sites)
        grads = plan_grads(grad_save, grad_edits, inv, model, named=grad_sites)
        named = Names.of(named, grad_named)
    if compiling is not None:
        with forward_errors(res, "trace"):
            result = compiled_trace(model, res.args, res.kwargs, save,
                                    _parts(model, plan, named), compiling, inv)
    elif grads is not None:  # a capture of its own, in the caller's grad mode
        args, kwargs = needing_grad(res.args, res.kwargs)
        with forward_errors(res, "trace"):
            result = capture(CaptureRequest(model, args, kwargs, save=save,
                                            inventory=res.inventory),
                             _parts(model, plan, grads, keeper, named, inv=inv))
        _warn_bn_train(result.meta["train_mode_batchnorm"])
    elif res.verified is not None:
        result = res.verified
        if not saves_nothing(save) or plan is not None or named is not None:
            check_save_budget(res.provenance, save)
            result = pinned_capture(model, res.args, res.kwargs, save=save, surface="trace",
                                    parts=_parts(model, plan, keeper, named, inv=inv))
            res.provenance["recapture"] = {
                "reason": f"save={save!r} is not satisfied by the metadata-only verified capture"
                if plan is None else "edits= apply to a capture of their own",
                "policy": "eval + no-grad, the mode inference verified",
            }
    else:
        with forward_errors(res, "trace"):
            result = capture(CaptureRequest(model, res.args, res.kwargs, save=save,
                                            inventory=res.inventory),
                             _parts(model, plan, keeper, named, inv=inv))
        _warn_bn_train(result.meta["train_mode_batchnorm"])
    result.provenance = res.provenance
    _note_edits(result, plan)
    result._objects.update({"model": model, "rerun": rerun, "labels": labels, "edits": edits,
                            **res.objects})
    if intervention_ready:
        prints = state_fingerprints(model)
        result.meta["state_baseline"] = {"digest": state_hash(model, fingerprints=prints),
                                         "tensors": prints}
    result.meta["options"] = {"save": save, "intervention_ready": intervention_ready,
                              "allow_unfired": allow_unfired}
    if grads is not None:
        result.meta["options"]["save_grads"] = grads.texts
    return result


def _parts(model: nn.Module, *parts: Any, inv: Any = None) -> list:
    """The parts a capture takes, those given (edits first, so observers see edited values),
    with the sharded gather around them for a model sharded across processes (``inv``: the
    model's inventory, whose parameter list is checked instead of walking the model)."""
    return sharded.join(model, [p for p in parts if p is not None],
                        params=inv.params if inv is not None else None)


def _note_edits(result: Trace, plan: EditPlan | None) -> None:
    """An edited trace's provenance says so, in every copy of it (saved files too)."""
    if plan is not None:
        result.provenance["edits"] = plan.specs()


def pinned_trace(model: nn.Module, input: Any, *, input_kwargs: dict | None, input_shape: Any,
                 surface: str, options: dict, warmup: bool = False, edits: Any = None,
                 allow_unfired: bool = False) -> Trace:
    """The pinned surfaces' capture: ONE metadata-only capture in eval + no-grad (on rung 3, the
    verified probe itself), with provenance and receipt attached; ``warmup`` runs one uncaptured
    forward first inside the same pinning (for timed tables); ``edits`` change that capture."""
    plan = None
    if edits is not None:
        inv = checked_inventory(model, surface)
        plan = plan_edits(edits, inv, model, allow_unfired, surface)
    res = resolve_for(
        model, input, input_kwargs=input_kwargs, input_shape=input_shape, surface=surface,
        options=options,
        probe=lambda a, k: pinned_capture(model, a, k, save=None, surface=surface,
                                          warmup=warmup))
    result = res.verified
    if result is None or plan is not None:
        with forward_errors(res, surface):
            result = pinned_capture(model, res.args, res.kwargs, save=None, surface=surface,
                                    warmup=warmup, inv=res.inventory,
                                    parts=_parts(model, plan, inv=res.inventory))
    result.provenance = res.provenance
    _note_edits(result, plan)
    result._objects.update({"model": model, "rerun": rerun, **res.objects})
    return result


@outside_inference_mode
def summary(model: nn.Module, input: Any = ABSENT, /, *, input_kwargs: dict | None = None,
            input_shape: Any = None, depth: int | None = 3, ops: bool = False,
            tokenizer: Any = None, processor: Any = None, preprocess: Any = None,
            edits: Any = None, allow_unfired: bool = False, grads: Any = False) -> Summary:
    """A module-tree table of ``model`` from ONE metadata-only capture pinned to eval + no-grad;
    the model's modes, RNG and buffers are restored and verified (``summary.receipt``). One
    uncaptured warm-up forward runs first under the same pinning, so the Time column does not
    count one-time setup (disclosed under the table). ``edits=``: the table of the edited
    model, marked as such. ``grads=True`` (the output summed) or ``grads=fn(output) ->
    scalar`` adds each module call's output-gradient norm, from one more forward and backward
    pinned to eval (grad on), the model's ``.grad`` untouched."""
    if grads is not False and grads is not True and not callable(grads):
        raise InputTypeError(f"grads= takes True or a function of the output, not {grads!r}",
                             code="option_invalid",
                             teach=["tl.summary(model, x, grads=True)",
                                    "tl.summary(model, x, grads=lambda out: out[0].sum())"])
    result = pinned_trace(model, input, input_kwargs=input_kwargs, input_shape=input_shape,
                          surface="summary",
                          options=input_options(tokenizer, processor, preprocess), warmup=True,
                          edits=edits, allow_unfired=allow_unfired)
    grad_trace = None
    if grads is not False:
        grad_trace = _summary_grads(model, input, input_kwargs, input_shape, grads,
                                    dict(tokenizer=tokenizer, processor=processor,
                                         preprocess=preprocess, edits=edits,
                                         allow_unfired=allow_unfired))
    return Summary(result, depth=depth, ops=ops, grads=grad_trace)


def _summary_grads(model: nn.Module, input: Any, input_kwargs: dict | None, input_shape: Any,
                   target: Any, options: dict) -> Trace:
    """The forward and backward behind ``tl.summary(grads=...)``: every module call's output a
    gradient site, in eval mode with grad on, the state restored and verified as the table's."""
    import torch

    inv = checked_inventory(model, "summary")
    addresses = list(inv.addresses)
    with pinned(model, "summary", grad=True, inv=inv), torch.enable_grad():
        result = trace(model, input, input_kwargs=input_kwargs, input_shape=input_shape,
                       save=None, save_grads=addresses, **options)
        result.backward(summed_output if target is True else target)
    result.meta["grad_target"] = "the output summed" if target is True else \
        getattr(target, "__name__", "grads=")
    return result


@outside_inference_mode
def draw(model: nn.Module, input: Any = ABSENT, /, *, input_kwargs: dict | None = None,
         input_shape: Any = None, theme: str = "light", collapse: str | int = "auto",
         module: str | None = None, depth: int | None = None, path: Any = None,
         file_format: str | None = None, open_viewer: bool = False, tokenizer: Any = None,
         processor: Any = None, preprocess: Any = None, edits: Any = None,
         allow_unfired: bool = False, **passthrough: Any):
    """The one-call picture: ONE metadata-only capture pinned to eval + no-grad (state restored
    and verified, ``result.receipt``), rendered with ``collapse="auto"``. Returns a detached
    ``tl.viz.Drawing``; every other keyword passes through to ``Trace.draw``."""
    dials = dict(theme=theme, collapse=collapse, module=module, depth=depth, path=path,
                 file_format=file_format, open_viewer=open_viewer, **passthrough)
    validate_options(**dict(dials))  # refuse a bad dial before any forward runs
    result = pinned_trace(model, input, input_kwargs=input_kwargs, input_shape=input_shape,
                          surface="draw", options=input_options(tokenizer, processor, preprocess),
                          edits=edits, allow_unfired=allow_unfired)
    return render_drawing(result, receipt=result.receipt, **dials)


def _warn_bn_train(mutated: list[str]) -> None:
    global _bn_warned
    if mutated and not _bn_warned:
        _bn_warned = True
        warn("batchnorm_train_stats_mutated",
             f"the model is in train mode, so this capture updated the running statistics of "
             f"{len(mutated)} BatchNorm layer(s) (e.g. {mutated[0]!r}), exactly as a plain "
             "forward would. Call model.eval() first to leave them untouched.", stacklevel=3)


def generator(teach: list[str]) -> Any:
    """The generation loop a plugin provides (``torchlens_generate``); refuses typed without
    one, before anything runs."""
    impl = hook().torchlens_generate()
    if impl is None:
        raise TorchLensError("tl.generate runs a model's own generation loop, which a plugin "
                             "provides (torchlens-hf: a Hugging Face model's generate); none is "
                             "installed", code="dependency_missing", teach=teach)
    return impl


def generate(lm: nn.Module, prompt: Any, /, **options: Any) -> Any:
    """Generate from ``prompt`` with ``lm``'s own loop and capture every forward it makes as a
    step (a ``StepRun``): ``max_new_tokens=``, ``save=``, ``edits=``, ``at_steps=``,
    ``allow_unfired=``, ``tokenizer=`` and the loop's own keywords. The loop comes from a
    plugin (torchlens-hf runs a Hugging Face model's ``generate``)."""
    return generator(["pip install torchlens-hf",
                      "with tl.steps(model) as run: ...  # any loop"])(lm, prompt, **options)


def load(path: str | os.PathLike) -> Trace:
    """Read a trace written by ``Trace.save`` (no code runs while loading)."""
    return load_trace(path)
