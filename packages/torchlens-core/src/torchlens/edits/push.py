"""``trace.push(edits)``: recompute only the ops downstream of the edited sites from the calls
the capture recorded, without calling ``forward``.

It needs an intervention-ready trace with every value saved (``tl.trace(model, x, save="all",
intervention_ready=True)`` keeps each op's call). It refuses ``push_unsafe`` where a recomputed
op's value decided Python control flow in the original forward (``bool()``, ``.item()``,
``.tolist()``), or where a recomputed op's output shape depends on values (``nonzero``, a
boolean mask): there the graph itself could differ, and only a re-run can tell.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch

from ..capabilities import provide
from ..capture.entry import check_baseline
from ..capture.inventory import inventory
from ..capture.replay import RANDOM_FUNCS, autocast_of, fresh_first, op_refs, resolve_template
from ..capture.seam import Part
from ..capture.transforms import call_batched
from ..errors import TorchLensError
from ..trace import Module, ModuleCall, Trace
from .plan import EditError, EditPlan
from .values import Where

# ops whose output shape depends on their inputs' values
_DATA_SHAPES = {"nonzero", "argwhere", "unique", "unique_consecutive", "masked_select",
                "repeat_interleave", "bincount"}
_INDEXING = {"getitem", "index", "index_select", "index_put", "index_put_", "take"}


class TemplateKeeper(Part):
    """Push's part: the capture keeps each op's call (and the ops whose values a Python
    decision read), on ``trace._objects["templates"]``, for ``trace.push``."""

    needs = frozenset({"templates", "decisions"})

    def finish(self, trace: Trace, session: Any) -> None:
        """The calls on the trace, for ``trace.push``."""
        if not session.failed:
            kept = session.kept()
            trace._objects["templates"] = {k: kept[k] for k in ("calls", "autocast", "orders",
                                                                "decided")}


@provide("push")
def push(trace: Trace, edits: Any, *, allow_unfired: bool = False) -> Trace:
    """A new Trace: ``trace`` with ``edits`` applied and every op downstream of them recomputed
    from its recorded call; the rest is shared with ``trace``. Equal to a re-run with the same
    edits where it runs."""
    templates, model = trace._objects.get("templates"), trace._objects.get("model")
    if templates is None or model is None or not all(op.saved for op in trace.ops):
        raise TorchLensError(
            "trace.push recomputes from every saved value and each op's recorded call; this "
            "trace keeps " + ("no calls" if templates is None else "not every value"),
            code="push_needs_values",
            teach=["trace = tl.trace(model, x, save='all', intervention_ready=True)",
                   "trace.push(edits)"])
    if trace.meta.get("sharded"):  # its values are whole, its model's parameters shards
        raise TorchLensError(
            "trace.push recomputes from the trace's values, which are whole, with the model's "
            "parameters, which are sharded across processes; that is not supported yet",
            code="push_sharded_unsupported",
            teach=["tl.trace(model, x, edits=edits)  # on every rank: a re-run with the edits",
                   "trace.run(x, edits=edits)"])
    if trace.edited:
        raise TorchLensError("trace.push starts from an unedited trace; this one ran with edits",
                             code="edit_invalid",
                             teach=["clean = tl.trace(model, x, save='all', "
                                    "intervention_ready=True); clean.push(edits)  # both "
                                    "edits in one push"])
    check_baseline(trace, model)
    plan = EditPlan(edits, inventory(model), model, allow_unfired=allow_unfired, surface="push")
    ops = trace.ops
    index_of = {op.label: op.index for op in ops}
    sites = _sites(trace, plan, index_of)
    downstream = _downstream(ops, index_of, sites)
    _refuse_unsafe(ops, templates, downstream | set(sites), downstream)
    values = {op.index: op._value for op in ops}
    calls, casts = templates["calls"], templates["autocast"]
    with torch.no_grad():
        for i in sorted(downstream | set(sites)):
            op = ops[i]
            if i in downstream:
                values[i] = _recompute(op, calls, casts, values, index_of, model, trace)
            for _, edit, position, where in sites.get(i, ()):
                where.inputs = where.inputs(values) if callable(where.inputs) else where.inputs
                values[i] = _edit(plan, edit, values[i], position, where, i)
    plan.refuse_unfired(trace)
    return _rebuilt(trace, values, plan, len(downstream))


def _sites(trace: Trace, plan: EditPlan, index_of: dict[str, int]) -> dict[int, list]:
    """op index -> (site, edit, position in the op's outputs, Where) of each edit there."""
    found: dict[int, list] = {}
    for op in trace.ops:
        for site, edit in plan.ops.get(op.base_label, ()) if op.kind == "op" else ():
            if site.pass_num is None or site.pass_num == op.pass_num:
                parents = [index_of[p] for p in op.parents or ()]
                where = Where(site.text, op.label, op.base_label, op.pass_num, op.module,
                              op.func, None, lambda values, ps=parents: _first_tensors(
                                  [values[p] for p in ps]), op.label)
                found.setdefault(op.index, []).append((site, edit, None, where))
    for address, entries in plan.modules.items():
        module = trace.modules.get(address)
        for call in module.calls if module is not None else ():
            for site, edit in entries:
                if site.pass_num is not None and site.pass_num != call.pass_num:
                    continue
                k = edit.item or 0
                if not isinstance(k, int) or k >= len(call.output_ops):
                    raise EditError(f"item={edit.item!r} at {site.text!r}: trace.push picks a "
                                    "module output by its position", code="edit_invalid",
                                    teach=["tl.trace(model, x, edits=...)  # a re-run"])
                inner = set(call.ops)
                outside = [index_of[p] for label in call.ops for p in trace[label].parents or ()
                           if p not in inner]
                where = Where(site.text, None, None, call.pass_num, address, None, None,
                              lambda values, ps=outside: _first_tensors(
                                  [values[p] for p in ps]), f"{address}:{call.pass_num}")
                found.setdefault(index_of[call.output_ops[k]], []).append(
                    (site, edit, call.positions[k], where))
    return found


def _first_tensors(values: list) -> list:
    return [v[0] if isinstance(v, tuple) else v for v in values]


def _downstream(ops: list, index_of: dict[str, int], sites: dict[int, list]) -> set[int]:
    """Every op that reads, directly or not, an edited op's value."""
    seen: set[int] = set()
    stack = [index_of[c] for i in sites for c in ops[i].children or ()]
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(index_of[c] for c in ops[i].children or ())
    return seen


def _refuse_unsafe(ops, templates, touched, downstream) -> None:
    why = []
    for i in sorted(touched):
        op = ops[i]
        if i in templates["decided"]:
            why.append(f"{op.label} (its value decided Python control flow)")
        elif i in downstream and op.func in _DATA_SHAPES:
            why.append(f"{op.label} ({op.func}: its shape depends on values)")
        elif i in downstream and op.func in RANDOM_FUNCS:
            why.append(f"{op.label} ({op.func} draws random numbers)")
        elif i in downstream and op.func in _INDEXING and any(
                (v := ops[j]._value) is not None and getattr(v, "dtype", None) is torch.bool
                for j in op_refs(templates["calls"][i][1:])):
            why.append(f"{op.label} (indexed by a boolean mask: its shape depends on values)")
    if why:
        raise EditError(
            f"trace.push cannot recompute {why[:3]}" + (f" and {len(why) - 3} more"
                                                       if len(why) > 3 else "")
            + ": with the edit the forward could take another path",
            code="push_unsafe", teach=["tl.trace(model, x, edits=...)  # a re-run is exact"])


def _recompute(op, calls, casts, values, index_of, model, trace) -> Any:
    if op.kind == "output":
        value = values[index_of[op.parents[0]]]
        if isinstance(value, tuple):  # the output tensor of a several-output op: by shape
            value = next(v for v in value if list(v.shape) == op.shape)
        return value
    func, args, kwargs = calls[op.index]
    args = fresh_first(op, resolve_template(args, trace, model, values))
    kwargs = resolve_template(kwargs, trace, model, values)
    with autocast_of(casts.get(op.index)):
        out = call_batched(func, args, kwargs)
    if isinstance(out, torch.Tensor):
        return out.detach()
    return tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in out)


def _edit(plan, edit, value, position, where, index) -> Any:
    if position is None or not isinstance(value, tuple):
        return plan._apply(edit, value, where, index, inplace=False, item=None)
    parts = list(value)
    parts[position] = plan._apply(edit, parts[position], where, index, inplace=False, item=None)
    return tuple(parts)


def _rebuilt(trace: Trace, values: dict[int, Any], plan: EditPlan, recomputed: int) -> Trace:
    """A new Trace sharing the structure, with the pushed values and the edits on record."""
    ops = [dataclasses.replace(op, _value=values[op.index]) for op in trace.ops]
    modules = {address: Module(m.address, m.type, m.depth, m.num_params, [
        ModuleCall(c.address, c.pass_num, c.type, c.ops, c.output_ops, c.time_ns,
                   positions=c.positions) for c in m.calls]) for address, m in
        trace.modules.items()}
    meta = copy.deepcopy(trace.meta)
    meta["edits"] = {"specs": plan.specs(), "fired": plan.rows(), "engine": "push",
                     "recomputed_ops": recomputed}
    provenance = copy.deepcopy(trace.provenance)
    provenance["edits"] = plan.specs()
    result = Trace(ops, modules, trace.params, trace.buffers, trace.output_structure, meta,
                   provenance=provenance, annotations=copy.deepcopy(trace.annotations))
    result._objects.update({k: v for k, v in trace._objects.items() if k != "templates"})
    return result
