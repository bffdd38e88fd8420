"""The recorder's one seam, shared: an edit plan changes values there, a gradient observer
notes where gradients will be read, each from its own room. ``Seams`` puts several plug-ins on
the seam in order (edits first, so observers see the edited value); with one plug-in the
recorder talks to it directly.

A plug-in has ``ops`` (base labels it wants, or ``EVERY_OP``), ``op(out, label, base, pass_num,
frame, func, args, index, inplace) -> out`` called after the op ran, ``modules`` (addresses)
and ``module(state, address, pass_num, args, output) -> output`` called as a call returns.
"""

from __future__ import annotations

from typing import Any


class _EveryOp:
    """``ops`` of a plug-in that wants every op: contains every label, names none."""

    def __contains__(self, base: object) -> bool:
        return True

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return True


EVERY_OP = _EveryOp()


class Seams:
    """Several plug-ins on the one seam, called in order."""

    def __init__(self, parts: list[Any]):
        self.parts = parts
        if any(p.ops is EVERY_OP for p in parts):
            self.ops: Any = EVERY_OP
        else:
            self.ops = {base for p in parts for base in p.ops}
        self.modules = {address: None for p in parts for address in p.modules}

    def op(self, out: Any, label: str, base: str, *rest: Any) -> Any:
        for part in self.parts:
            if base in part.ops:
                out = part.op(out, label, base, *rest)
        return out

    def module(self, state: Any, address: str, pass_num: int, args: tuple, output: Any) -> Any:
        for part in self.parts:
            if address in part.modules:
                output = part.module(state, address, pass_num, args, output)
        return output


def combine(*parts: Any) -> Any:
    """The seam for these plug-ins (None ones left out): None, the one, or ``Seams``."""
    present = [p for p in parts if p is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else Seams(present)
