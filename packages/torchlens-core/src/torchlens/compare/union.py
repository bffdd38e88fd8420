"""The graph a diff is drawn from: b's ops with a's ops that b lacks put in place, each op's
difference in ``op.meta["diff"]`` and the pair in ``meta["diff"]``. It is an ordinary Trace
(no values), so the static drawing and the viewer build it like any other: the diff is data."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..sites import name_of, split_pass
from ..trace import Module, Op, Trace
from .metrics import STAT_KEYS

LARGE = 1e30  # an infinite or NaN difference, coloured as the largest (JSON has no inf)


def _finite(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else LARGE


def op_diff(row: Any) -> dict[str, Any]:
    """What one drawn op says of its difference (JSON-safe)."""
    out = {"status": row.status, "a": row.a, "b": row.b, "values": row.values,
           "changes": row.changes, "shape_a": row.shape_a, "shape_b": row.shape_b,
           "dtype_a": row.dtype_a, "dtype_b": row.dtype_b}
    for key in STAT_KEYS:
        out[key] = _finite(getattr(row, key))
    out["text"] = {key: None if getattr(row, key) is None else f"{getattr(row, key):.4g}"
                   for key in STAT_KEYS}
    return out


def union_trace(cmp: Any) -> Trace:
    """b's graph plus the ops only a has, ready to draw."""
    a, b = cmp.a, cmp.b
    taken = {op.label for op in b.ops}
    rename: dict[str, str] = {}  # a label -> its label in the union
    for row in cmp.rows:
        if row.a is None:
            continue
        if row.b is not None:
            rename[row.a] = row.b
        else:
            op = a[row.a]
            label = row.a if row.a not in taken else f"{op.base_label}~{cmp.names[0]}" + (
                f":{op.pass_num}" if split_pass(row.a)[1] is not None else "")
            rename[row.a] = label
            taken.add(label)
    modules = {address: m.copy() for address, m in b.modules.items()}
    for address, m in a.modules.items():
        if address not in modules:
            modules[address] = m.copy(rename)
    ops: list[Op] = []
    for row in cmp.rows:
        if row.b is not None:
            op = dataclasses.replace(b[row.b], saved=False, _value=None)
        else:
            op = _removed(a[row.a], rename, modules)
        op.meta = {**(op.meta or {}), "diff": op_diff(row)}
        op.index = len(ops)
        ops.append(op)
    children: dict[str, list[str]] = {}
    for op in ops:
        for parent in op.parents:
            children.setdefault(parent, []).append(op.label)
    for op in ops:
        op.children = children.get(op.label, [])
    params = {**{k: v for k, v in a.params.items() if k not in b.params}, **b.params}
    first = cmp.first_divergence()
    meta = {**b.meta, "model_class": cmp._title(),
            **({"edits": {**b.meta["edits"], "fired": [
                dict(r, label=b.ops[r["op_index"]].label) if r["label"] is None
                and r.get("op_index") is not None else r for r in b.meta["edits"]["fired"]]}}
               if b.edited else {}),
            "diff": {"a": cmp.names[0], "b": cmp.names[1], "atol": cmp.atol, "rtol": cmp.rtol,
                     "first": first.label if first else None,
                     "first_where": first.where() if first else None}}
    return Trace(ops, modules, params, dict(b.buffers), b.output_structure, meta,
                 provenance=b.provenance)


def _removed(op: Op, rename: dict[str, str], modules: dict[str, Module]) -> Op:
    """An op only a has, with a's labels turned into the union's and only the module calls the
    union has kept around it."""
    stack = []
    for key in op.module_stack or ():
        address, pass_num = split_pass(key)
        if address in modules and pass_num <= len(modules[address].calls):
            stack.append(key)
    module, pass_num = split_pass(stack[-1]) if stack else ("", 1)
    return dataclasses.replace(
        op, label=rename[op.label], base_label=name_of(rename[op.label]),
        parents=[rename.get(p, p) for p in op.parents or ()], module_stack=stack,
        module=module, module_pass=pass_num,
        module_outputs=[k for k in op.module_outputs or () if k in stack],
        saved=False, _value=None)
