"""Stable, readable names for intercepted torch callables (``Tensor.__iadd__`` -> ``add_``)."""

from __future__ import annotations

from typing import Any

_DUNDER_ALIASES = {
    "truediv": "div", "rtruediv": "div", "div": "div", "rdiv": "div", "floordiv": "floor_divide",
    "rfloordiv": "floor_divide", "mod": "remainder", "rmod": "remainder", "radd": "add",
    "rmul": "mul", "rmatmul": "matmul", "rpow": "pow", "rand": "and", "ror": "or", "rxor": "xor",
    "rlshift": "lshift", "rrshift": "rshift", "itruediv": "div_", "ifloordiv": "floor_divide_",
    "imod": "remainder_",
}
_INPLACE_DUNDERS = {"iadd", "isub", "imul", "idiv", "ipow", "iand", "ior", "ixor", "ilshift",
                    "irshift", "imatmul"}

NAMES: dict[Any, str] = {}  # callable -> name, filled by func_name (read directly on hot paths)


def func_name(func: Any) -> str:
    """The short name an op is labelled by; cached per callable."""
    try:
        return NAMES[func]
    except (KeyError, TypeError):
        pass
    packet = getattr(func, "overloadpacket", None)  # ``torch.ops.aten.linear.default``: linear
    name = getattr(packet or func, "__name__", None) or type(func).__name__
    if name in ("__get__", "__set__"):  # a Tensor property such as .T or .data
        owner = getattr(func, "__self__", None)
        prefix = "set_" if name == "__set__" else ""  # ``t.data = v`` is ``set_data``
        name = prefix + getattr(owner, "__name__", name)
    if name.startswith("__") and name.endswith("__"):
        core = name[2:-2]
        if core in _DUNDER_ALIASES:
            name = _DUNDER_ALIASES[core]
        elif core in _INPLACE_DUNDERS:
            name = core[1:] + "_"
        else:
            name = core
    name = name.lstrip("_") or "op"
    try:
        NAMES[func] = name
    except TypeError:
        pass
    return name
