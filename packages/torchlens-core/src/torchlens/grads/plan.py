"""``save_grads=`` and ``grad_edits=`` resolved against the model before any forward: the
sites (the vocabulary of ``save=``), the edits (those of ``tl.edits`` that make sense on a
gradient), and the refusals that need no forward (grad mode off, a meta model)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..capture.seam import Part
from ..edits.values import as_edit
from ..errors import InputError, InputTypeError, grads_unavailable
from ..sites import Site, resolve
from .backward import GradState
from .observer import GradObserver

FORWARD_ONLY = ("patch", "mean", "skip")  # edits whose value comes from a forward


class GradPlan(Part):
    """The part of ``save_grads=``: its observer notes the gradient edges of the sites as the
    forward makes them; the trace keeps them, with the live output, for ``trace.backward``."""

    needs = frozenset({"output"})

    def __init__(self, observer: GradObserver, edits: list[tuple[Site, Any]], texts: list[str]):
        self.observer, self.edits, self.texts = observer, edits, texts
        self.ops, self.modules = observer.ops, observer.modules
        self.op, self.module = observer.op, observer.module

    def start(self, session: Any) -> None:
        """The inputs are sites too (``input_1``, ...): no op makes them."""
        self.observer.inputs(session.state, session.inputs)

    def finish(self, trace: Any, session: Any) -> None:
        """The noted edges and the live output on the trace, for ``trace.backward``."""
        if not session.failed:
            trace._objects["grads"] = GradState(
                self.observer, session.output, self.edits,
                list(session.request.model.parameters()), self.texts)


def plan_grads(save_grads: Any, grad_edits: Any, inv: Any, model: torch.nn.Module,
               named: Mapping[str, list[Site]] | None = None) -> GradPlan | None:
    """None when neither is asked; otherwise the plan, or a refusal before any forward."""
    if save_grads is None and not grad_edits:
        return None
    if not torch.is_grad_enabled():
        raise grads_unavailable("grad mode is off here (torch.no_grad() or "
                                "torch.inference_mode()), so the forward builds no autograd graph",
                                teach=["with torch.enable_grad():\n    trace = "
                                       "tl.trace(model, x, save_grads=...)"])
    if inv.has_meta:
        raise grads_unavailable("the model has parameters on the meta device, which hold no "
                                "values",
                                teach=["model.to_empty(device='cpu'); "
                                       "model.load_state_dict(weights)  "
                                       "# then tl.trace(model, x, save_grads=...)"])
    addresses = inv.addresses
    name = type(model).__name__
    every = save_grads == "all"
    texts = [] if every or save_grads is None else (
        [save_grads] if isinstance(save_grads, str) else save_grads)
    if not every and (not isinstance(texts, (list, tuple)) or
                      not all(isinstance(t, str) for t in texts)):
        raise InputTypeError(f"save_grads= takes 'all' or a list of sites, not {save_grads!r}",
                             code="save_selection_invalid",
                             teach=['tl.trace(model, x, save_grads="all")',
                                    'tl.trace(model, x, save_grads=["transformer.h.*"])'])
    sites = [site for text in texts for site in resolve(
        text, addresses, option="save_grads=", model_class=name, code="save_selection_invalid",
        example=lambda c: f"tl.trace(model, x, save_grads=[{c!r}])")]
    if any(site.kind == "name" for site in sites):
        raise InputError("save_grads= names transformer names on a surface that does not bind "
                         "them", code="save_selection_invalid",
                         teach=["tl.trace(model, x, save_grads=['blocks.0.hook_resid_post'])"])
    edits: list[tuple[Site, Any]] = []
    if grad_edits:
        if not isinstance(grad_edits, Mapping):
            raise InputTypeError("grad_edits= takes a mapping {site: edit}",
                                 code="edit_invalid",
                                 teach=["tl.trace(model, x, save_grads='all', "
                                        "grad_edits={'relu_3': tl.edits.zero()})"])
        for text, value in grad_edits.items():
            edit = as_edit(value)
            if edit.kind in FORWARD_ONLY:
                raise InputTypeError(
                    f"tl.edits.{edit.kind} takes its value from a forward; a gradient edit "
                    "takes zero, scale, add, replace or a callable", code="edit_invalid",
                    teach=[f"grad_edits={{{text!r}: tl.edits.zero()}}",
                           f"grad_edits={{{text!r}: lambda grad, op: grad * 0.5}}"])
            for site in (named or {}).get(text) or resolve(
                    text, addresses, option="grad_edits=", model_class=name,
                    code="edit_site_unknown",
                    example=lambda c: f"grad_edits={{{c!r}: tl.edits.zero()}}"):
                if site.kind == "name" or site.lens is not None and not site.lens.identity:
                    raise InputError(
                        f"grad_edits= at {text!r}: a gradient edit takes a name whose value "
                        "is its op's output as it is (the residual stream, a branch's output), "
                        "not a view of it (heads, patterns)", code="edit_invalid",
                        teach=["grad_edits={'blocks.0.hook_resid_post': tl.edits.zero()}",
                               f"tl.trace(model, x, save=[{text!r}]).meta['names']  "
                               "# the op it stands on"])
                edits.append((site, edit))
    observer = GradObserver(sites + [site for site, _ in edits], every)
    return GradPlan(observer, edits, ["all"] if every else list(texts))


def needing_grad(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Floating-point inputs as leaves that require grad (the caller's tensors untouched), so
    that the input and every op after it have a gradient even in a frozen model."""
    from torch.utils._pytree import tree_map_only

    def lift(t: torch.Tensor) -> torch.Tensor:
        if t.requires_grad or not (t.is_floating_point() or t.is_complex()):
            return t
        return t.detach().requires_grad_(True)

    return tree_map_only(torch.Tensor, lift, args), tree_map_only(torch.Tensor, lift, kwargs)
