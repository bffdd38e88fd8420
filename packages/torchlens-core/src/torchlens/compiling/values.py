"""A Trace of the eager capture's graph holding a compiled forward's values: each tapped op's
value, and each module's output on the ops that returned it; nothing else is saved."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..capture.boundaries import leaves
from ..sites import split_pass
from ..trace import Trace


def with_values(structure: Trace, raw: dict[str, Any], capture_ns: int) -> Trace:
    """``structure``'s ops and modules, saved only where ``raw`` (op labels, module calls)
    has a value."""
    values: dict[str, Any] = {}
    modules = structure.modules
    for key, value in raw.items():
        address, pass_num = split_pass(key)
        module = modules.get(address)
        if module is None:
            values[key] = value
            continue
        call = module.calls[(pass_num or 1) - 1]
        for label, position, leaf in zip(call.output_ops, call.positions, leaves(value, [])):
            if position == 0:
                values[label] = leaf
    ops = [dataclasses.replace(op, saved=op.label in values, _value=values.get(op.label),
                               meta=dict(op.meta or {}))
           for op in structure.ops]
    meta = dict(structure.meta, capture_ns=capture_ns)
    meta.pop("receipt", None)  # the eager capture's, not this one's
    return Trace(ops, {a: m.copy() for a, m in modules.items()}, dict(structure.params),
                 dict(structure.buffers), structure.output_structure, meta,
                 provenance=dict(structure.provenance or {}))
