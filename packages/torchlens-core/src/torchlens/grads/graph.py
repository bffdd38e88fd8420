"""The backward graph of a ``save_grads`` capture as a Trace to draw: one node per autograd node
the forward made (``AddmmBackward0``, ``AccumulateGrad`` of a parameter), edges the way the
gradient flows, each node placed in the module call of the forward op it belongs to. An
autograd node no site noted belongs to the op whose node leads to it (a linear's transpose
belongs to the linear). Drawn by the same renderers as any trace: the graph is data."""

from __future__ import annotations

from typing import Any

from ..capabilities import provide
from ..capture.boundaries import leaves
from ..errors import GRADS_TEACH, GradError
from ..trace import Module, ModuleCall, Op, Trace


@provide("backward_trace")
def backward_trace(trace: Any) -> Trace:
    """The backward graph of ``trace`` (before a backward without ``retain_graph`` frees it)."""
    state = trace._objects.get("grads")
    if state is None:
        raise GradError("draw(backward=True) needs the autograd graph of a save_grads= capture",
                        code="grads_unavailable", teach=[GRADS_TEACH])
    if not state.retained or state.output is None:
        raise GradError("this trace's backward freed its autograd graph",
                        code="grads_graph_freed",
                        teach=["trace.draw(backward=True)  # before trace.backward(...)",
                               "trace.backward(target, retain_graph=True)"])
    owner: dict[int, int] = {}  # id(autograd node) -> forward op index
    for index, slots in state.observer.slots.items():
        for slot in slots:
            if slot.edge is not None:
                owner.setdefault(id(slot.edge.node), index)
    names = _param_names(trace)
    roots = [t.grad_fn for t in leaves(state.output, []) if t.grad_fn is not None]
    order, nodes, parents = _walk(roots)
    of_op: dict[int, int | None] = {}
    for key in order:  # roots first: a node no site noted takes the op of the node before it
        found = owner.get(key)
        if found is None:
            found = next((of_op[p] for p in parents[key] if of_op.get(p) is not None), None)
        of_op[key] = found
    return _as_trace(trace, order, nodes, parents, of_op, names, set(owner))


def _walk(roots: list[Any]) -> tuple[list[int], dict[int, Any], dict[int, list[int]]]:
    """Every node reachable from ``roots``, in an order where a node comes after all the nodes
    whose gradient flows into it; ``parents[n]``: those nodes."""
    nodes: dict[int, Any] = {}
    parents: dict[int, list[int]] = {}
    stack = list(roots)
    for root in roots:
        nodes[id(root)] = root
        parents.setdefault(id(root), [])
    while stack:
        node = stack.pop()
        for nxt, _ in node.next_functions:
            if nxt is None:
                continue
            if id(nxt) not in nodes:
                nodes[id(nxt)] = nxt
                parents[id(nxt)] = []
                stack.append(nxt)
            if id(node) not in parents[id(nxt)]:
                parents[id(nxt)].append(id(node))
    waiting = {k: len(v) for k, v in parents.items()}
    children: dict[int, list[int]] = {k: [] for k in nodes}
    for k, ps in parents.items():
        for p in ps:
            children[p].append(k)
    ready = [id(r) for r in roots if waiting[id(r)] == 0]
    order: list[int] = []
    while ready:
        key = ready.pop(0)
        order.append(key)
        for child in children[key]:
            waiting[child] -= 1
            if waiting[child] == 0:
                ready.append(child)
    return order, nodes, parents


def _param_names(trace: Any) -> dict[int, str]:
    model = trace._objects.get("model")
    if model is None:
        return {}
    names: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), name)  # a tied parameter by its first name, as trace.params
    return names


def _as_trace(trace: Any, order: list[int], nodes: dict, parents: dict, of_op: dict,
              names: dict[int, str], own: set[int]) -> Trace:
    """``own``: the nodes that made a noted op's output (their gradient has its shape)."""
    counts: dict[str, int] = {}
    labels: dict[int, str] = {}
    ops: list[Op] = []
    members: dict[str, list[str]] = {}  # "address:pass" -> backward labels
    for key in order:
        node = nodes[key]
        name = type(node).__name__
        counts[name] = counts.get(name, 0) + 1
        label = f"{name}_{counts[name]}"
        labels[key] = label
        forward = trace.ops[of_op[key]] if of_op.get(key) is not None else None
        variable = getattr(node, "variable", None)
        param = names.get(id(variable)) if variable is not None else None
        if param is not None:
            note = f"into {param}.grad"
        elif variable is not None:
            note = f"into {forward.label if forward is not None else 'an input'}"
        else:
            note = f"for {forward.label}" if forward is not None else ""
        if param is not None:
            shape = trace.params.get(param, {}).get("shape")
        else:
            shape = forward.shape if forward is not None and key in own else None
        op = Op(len(ops), label, label, 1, "op", name, [labels[p] for p in parents[key]], [],
                list(shape) if shape is not None else None,
                forward.dtype if forward is not None else None,
                forward.device if forward is not None else None, None, 0,
                forward.module if forward is not None else "",
                forward.module_pass if forward is not None else 1,
                list(forward.module_stack or []) if forward is not None else [], [],
                [param] if param else [], [], 0, None, False, False, None, False,
                {"forward_op": forward.label if forward is not None else None, "note": note})
        op.out_shapes = [op.shape] if op.shape is not None else [[]]
        ops.append(op)
        for call in op.module_stack:
            members.setdefault(call, []).append(label)
    for op in ops:
        op.children = []
    by_label = {op.label: op for op in ops}
    for op in ops:
        for p in op.parents:
            by_label[p].children.append(op.label)
    modules = {}
    for address, module in trace.modules.items():
        calls = [ModuleCall(c.address, c.pass_num, c.type, members.get(c.label, []), [],
                            c.time_ns) for c in module.calls]
        modules[address] = Module(address, module.type, module.depth, module.num_params, calls)
    meta = {**{k: v for k, v in trace.meta.items() if k not in ("edits", "diff")},
            "model_class": f"{trace.meta.get('model_class', 'model')} backward"}
    return Trace(ops, modules, dict(trace.params), {}, {"type": "value", "repr": None}, meta,
                 provenance=trace.provenance)
