"""Replaying a recorded call: the templates a capture keeps (``CaptureState.template``) turned
back into arguments from saved values, in the autocast regions the op ran in. Validation
replays every op; ``trace.push`` replays the ops downstream of an edit."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from .transforms import Batched

# Ops whose values are random or uninitialized by design: replay cannot reproduce them. Dropout
# is not among them: validation runs pinned to eval, where it is the identity.
RANDOM_FUNCS = {"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "normal",
                "normal_", "uniform_", "bernoulli", "bernoulli_", "multinomial", "randperm",
                "rrelu", "empty", "empty_like", "exponential_", "geometric_", "cauchy_",
                "log_normal_", "random_"}


def resolve_template(template: Any, trace, model: nn.Module, values: dict[int, Any]) -> Any:
    """A recorded call's arguments: each reference to an op, parameter or buffer replaced by
    its saved value (``values``: op index -> value), constants as recorded."""
    if isinstance(template, tuple) and len(template) in (2, 3, 4) and isinstance(template[0],
                                                                                 str):
        kind = template[0]
        if kind == "op":
            value = values[template[1]]
            value = value[template[2]] if isinstance(value, tuple) else value
            return value.reshape(template[3]) if len(template) == 4 else value
        if kind == "param":
            return model.get_parameter(template[1])
        if kind == "buffer":
            return model.get_buffer(template[1])
        if kind == "const":
            return template[1]
        if kind == "batched":  # inside torch.vmap: replayed under vmap (call_batched)
            value = resolve_template(template[1], trace, model, values)
            return Batched(value if template[2] is None else value.permute(template[2]),
                           template[3])
    if isinstance(template, tuple) and len(template) == 6 and template[0] == "view":
        # a view torch.vmap returned of a real tensor: rebuilt from its saved value
        _, inner, back, size, stride, offset = template
        real = resolve_template(inner, trace, model, values).permute(back).contiguous()
        return real.as_strided(size, stride, offset)
    if isinstance(template, (tuple, list)):
        return type(template)(resolve_template(t, trace, model, values) for t in template)
    if isinstance(template, dict):
        return {k: resolve_template(v, trace, model, values) for k, v in template.items()}
    return template


def autocast_of(casts: tuple | None) -> contextlib.AbstractContextManager:
    """The autocast regions an op ran in (``(device type, dtype)`` each), entered again."""
    stack = contextlib.ExitStack()
    for device_type, dtype in casts or ():
        stack.enter_context(torch.autocast(device_type, dtype=dtype))
    return stack


def fresh_first(op, args: tuple) -> tuple:
    """An in-place op's arguments with a copy of what it writes, so saved values stay."""
    if not op.inplace or not args:
        return args
    if isinstance(args[0], Batched):
        return (Batched(args[0].value.clone(), args[0].levels), *args[1:])
    if isinstance(args[0], torch.Tensor):
        return (args[0].clone(), *args[1:])
    return args


def op_refs(template: Any) -> set[int]:
    """The op indices a template reads."""
    if isinstance(template, tuple) and len(template) in (3, 4) and template[0] == "op":
        return {template[1]}
    if isinstance(template, tuple) and len(template) in (4, 6) and template[0] in ("batched",
                                                                                  "view"):
        return op_refs(template[1])
    if isinstance(template, (tuple, list)):
        return set().union(*(op_refs(t) for t in template)) if template else set()
    if isinstance(template, dict):
        return set().union(*(op_refs(t) for t in template.values())) if template else set()
    return set()
