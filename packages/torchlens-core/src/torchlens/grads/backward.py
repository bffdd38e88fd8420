"""``trace.backward(target)``: one backward from a scalar target to every slot ``save_grads=``
noted, with ``grad_edits=`` applied as the gradient passes their sites, and nothing left
hooked. Parameter gradients are written only when asked (``param_grads=True``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..capabilities import provide
from ..errors import (
    GRADS_TEACH,
    EditError,
    GradError,
    TorchLensError,
    first_line,
    grads_unavailable,
)
from ..sites import split_pass
from ..trace import NO_GRAD
from ..units import format_shape
from .observer import GradObserver


class GradState:
    """What a ``save_grads`` capture keeps for its backward (in ``trace._objects["grads"]``):
    the observer's slots, the forward's live output, the gradient edits, the parameters."""

    def __init__(self, observer: GradObserver, output: Any, edits: list, params: list,
                 sites: list[str]):
        self.observer, self.output, self.edits = observer, output, edits
        self.params, self.sites = params, sites
        self.runs = 0
        self.retained = True  # no backward has freed the graph yet


def _target(trace: Any, state: GradState, target: Any) -> Tensor:
    if target is None:
        out = state.output
        if isinstance(out, Tensor) and out.numel() == 1:
            return out.reshape(())
        raise GradError(
            "trace.backward() needs a target: the output is not a scalar",
            code="grads_target_invalid",
            teach=["trace.backward(trace.output.sum())",
                   "trace.backward(lambda out: out.logits[0, -1, 42])",
                   f"trace.backward({trace.outputs[0].label!r})  # an op's value, summed"])
    if callable(target) and not isinstance(target, Tensor):
        try:
            target = target(state.output)
        except TorchLensError:
            raise
        except Exception as exc:  # the target function's own error, chained
            raise GradError(f"the target function raised on the output: "
                            f"{type(exc).__name__}: {first_line(exc)}",
                            code="grads_target_invalid",
                            teach=["trace.backward(lambda out: out.sum())"]) from exc
    elif isinstance(target, str):
        target = _op_value(trace, state, target).sum()
    if not isinstance(target, Tensor):
        raise GradError(f"the target is {type(target).__name__}, not a tensor",
                        code="grads_target_invalid",
                        teach=["trace.backward(trace.output.sum())"])
    if target.numel() != 1:
        raise GradError(f"the target has shape {format_shape(target.shape)}: a backward starts "
                        "from one number", code="grads_target_invalid",
                        teach=["trace.backward(target.sum())", "trace.backward(target[0, 3])"])
    if not target.requires_grad:
        raise GradError("the target does not depend on anything that needs a gradient (was it "
                        "computed from a detached value, e.g. op.out?)",
                        code="grads_target_invalid",
                        teach=["trace.backward(lambda out: out.sum())  # from the live output"])
    return target.reshape(())


def _op_value(trace: Any, state: GradState, label: str) -> Tensor:
    op = trace[label]
    slots = state.observer.slots.get(op.index) if hasattr(op, "index") else None
    if not slots:
        raise GradError(f"{label!r} is not a site of save_grads=, so its live value was not "
                        "kept to sum", code="grads_target_invalid",
                        teach=[f"tl.trace(model, x, save_grads=[{label!r}, ...])",
                               "trace.backward(lambda out: out.sum())"])
    slot = slots[0]
    if slot.value._version != slot.version:
        raise GradError(f"{label!r}'s value was written in place after it was made; its "
                        "value as made is gone", code="grads_target_invalid",
                        teach=[f"trace.backward({trace.ops[op.index + 1].label!r})"
                               if op.index + 1 < len(trace.ops) else GRADS_TEACH])
    return slot.value


@provide("backward")
def run_backward(trace: Any, target: Any = None, *, retain_graph: bool = False,
                 param_grads: bool = False) -> Any:
    """Compute every noted gradient for ``target``; returns the trace's gradient table."""
    from .table import GradTable

    state: GradState | None = trace._objects.get("grads")
    if state is None:
        raise grads_unavailable("this trace was not captured with save_grads= (or was loaded "
                                "from a file, which keeps no autograd graph)")
    if not state.retained:
        raise GradError("this trace's backward already ran and freed the autograd graph",
                        code="grads_graph_freed",
                        teach=["trace.backward(target, retain_graph=True)  # on a new trace, "
                               "to run backward again", GRADS_TEACH])
    target = _target(trace, state, target)
    slots = [slot for index in sorted(state.observer.slots)
             for slot in state.observer.slots[index] if slot.edge is not None]
    edges = [slot.edge for slot in slots]
    forced = []  # the inputs of edited nodes: asking for them makes autograd run those nodes
    handles = []
    fired: list[dict[str, Any]] = []
    try:
        for _, edit, slot, row in _edit_slots(trace, state):
            handles.append(slot.edge.node.register_prehook(_editing(edit, slot, row, fired)))
            forced += [torch.autograd.graph.GradientEdge(node, nr)
                       for node, nr in slot.edge.node.next_functions if node is not None]
        params = [p for p in state.params if p.requires_grad] if param_grads else []
        grads = torch.autograd.grad(target, edges + forced + params, retain_graph=retain_graph,
                                    allow_unused=True) if edges or forced or params else ()
    except BaseException:
        state.retained = state.retained and retain_graph  # a backward cut short freed it too
        raise
    finally:
        for handle in handles:
            handle.remove()
    state.runs += 1
    state.retained = retain_graph
    values: dict[int, list] = {}
    for slot, grad in zip(slots, grads):
        if grad is None:
            grad = torch.zeros_like(slot.value)
        values.setdefault(slot.index, []).append((slot.position, grad.detach()))
    for index, found in values.items():
        found.sort(key=lambda item: item[0])
        trace.ops[index]._grad = found[0][1] if len(found) == 1 else tuple(g for _, g in found)
    for index in state.observer.slots:
        if index not in values:  # none of its tensors needs a gradient (integers, constants)
            trace.ops[index]._grad = NO_GRAD
    for settle in trace._objects.get("grad_settlers", ()):  # e.g. a sharded model's gather
        settle(trace)  # of each gradient whole, on every rank
    for op in trace.outputs:  # an output node is its producer's tensor: the same gradient
        if op.parents and trace[op.parents[0]]._grad is not None:
            op._grad = trace[op.parents[0]]._grad
    for p, grad in zip(params, grads[len(edges) + len(forced):]):
        if grad is not None:
            p.grad = grad if p.grad is None else p.grad + grad
    trace.meta["grad_edits"] = {"specs": [{"site": s, **e.describe()} for s, e in _specs(state)],
                                "fired": fired}
    if not retain_graph:  # the graph is freed: let its tensors go
        for slot_list in state.observer.slots.values():
            for slot in slot_list:
                slot.edge, slot.value = None, None
        state.output = None
    _refuse_unfired(trace, state, fired)
    return GradTable.of(trace)




def _specs(state: GradState) -> list:
    seen: dict[str, Any] = {}
    for site, edit in state.edits:
        seen.setdefault(site.text, edit)
    return list(seen.items())


def _edit_slots(trace: Any, state: GradState):
    """(site, edit, slot, row) of every noted tensor a gradient edit names."""
    observer = state.observer
    for site, edit in state.edits:
        if site.kind == "op":
            indices = [op.index for op in trace.ops if op.base_label == site.name
                       and (site.pass_num is None or op.pass_num == site.pass_num)]
        else:
            indices = [i for key, found in observer.calls.items()
                       if site.matches(*split_pass(key))
                       for i in found]
        for index in indices:
            slots = [s for s in observer.slots.get(index, ()) if s.edge is not None]
            op = trace.ops[index]
            for slot in slots[:1] if edit.item is None else slots:
                if edit.item is not None and slot.position != edit.item:
                    continue
                yield site, edit, slot, {
                    "site": site.text, "label": op.label, "pass": op.pass_num,
                    "module": op.module, "op_index": index, "kind": f"{edit.kind} (grad)",
                    "shape": list(slot.value.shape), "index": _index_text(edit),
                    "item": edit.item if isinstance(edit.item, (int, str)) else None,
                    "backward": True}


def _index_text(edit: Any) -> str | None:
    from ..edits.values import index_text

    return index_text(edit.index)


def _editing(edit: Any, slot: Any, row: dict, fired: list) -> Callable:
    """A node pre-hook: the gradient arriving for ``slot``'s output edited as ``edit`` says."""
    from ..edits.values import Where

    def hook(grad_outputs: tuple) -> tuple:
        grads = list(grad_outputs)
        grad = grads[slot.edge.output_nr]
        if grad is None:
            return grad_outputs
        where = Where(row["site"], row["label"], None, row["pass"], row["module"], None,
                      list(grad.shape), [], None)
        part = grad if edit.index is None else _indexed(grad, edit, row)
        new = edit.new(part, where)
        if edit.index is None:
            edited = new.expand_as(part).to(part.dtype)
        else:
            edited = grad.clone()
            edited[edit.index] = new
        fired.append(dict(row, norm=float((edited.double() - grad.double()).norm()),
                          fired=True))
        fired[-1]["zero_change"] = fired[-1]["norm"] == 0.0
        grads[slot.edge.output_nr] = edited
        return tuple(grads)

    return hook


def _indexed(grad: Tensor, edit: Any, row: dict) -> Tensor:
    """``grad[edit.index]``; an index the gradient's shape does not have refuses typed
    (``edit_index_out_of_range``), teaching the call with the index brought in range."""
    from ..edits.values import fitted_index, index_text

    try:
        return grad[edit.index]
    except IndexError as exc:
        fitted, wrong = fitted_index(edit.index, grad.shape)
        said = first_line(exc)
        if wrong:
            axis, item, size = wrong[0]
            said = f"{index_text((item,))[1:-1]} is past the end of axis {axis} (size " \
                f"{size})" if size else f"the gradient has no axis {axis}"
        site = row["site"]
        raise EditError(
            f"the gradient edit at {site!r} ({row['label']}) indexes {index_text(edit.index)}, "
            f"but the gradient there has shape {format_shape(grad.shape)}: {said}",
            code="edit_index_out_of_range",
            teach=[f"tl.trace(model, x, save_grads=[{site!r}], grad_edits={{{site!r}: "
                   f"{edit.code(fitted)}}})"]) from None


def _refuse_unfired(trace: Any, state: GradState, fired: list) -> None:
    done = {row["site"] for row in fired}
    missing = [text for text, _ in _specs(state) if text not in done]
    if missing:
        raise GradError(
            f"gradient edits at {missing} never fired: no gradient of the target reached them "
            "(the site is not upstream of the target, or needs no gradient)",
            code="edit_site_not_fired",
            teach=["trace.grads  # which sites received a gradient",
                   "tl.trace(model, x, save_grads=..., grad_edits={...})  # a site upstream"])
