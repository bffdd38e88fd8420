"""Match the ops of two traces: the same op in both runs, in graph order.

Two runs of one model give the same labels, so they match one to one at once. Otherwise the op
sequences are aligned on (kind, module call, function) with difflib; inside a stretch that
differs, ops of the same module call pair up in order as one op whose function changed, and
the rest are on one side only.
"""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import Any

Pair = tuple[int | None, int | None]  # (index in a, index in b); None: on one side only


def _key(op: Any) -> tuple:
    return op.kind, op.module, op.module_pass, op.func


def _where(op: Any) -> tuple:
    return op.kind, op.module, op.module_pass


def match_ops(a: list[Any], b: list[Any]) -> list[Pair]:
    """Every op of ``a`` and of ``b`` once, matched where they are the same op, in order."""
    if len(a) == len(b) and all(x.label == y.label and _key(x) == _key(y) for x, y in zip(a, b)):
        return [(i, i) for i in range(len(a))]
    pairs: list[Pair] = []
    blocks = SequenceMatcher(None, [_key(op) for op in a], [_key(op) for op in b],
                             autojunk=False).get_opcodes()
    for tag, i1, i2, j1, j2 in blocks:
        if tag == "equal":
            pairs.extend(zip(range(i1, i2), range(j1, j2)))
        elif tag == "replace":
            pairs.extend(_pair_changed(a, b, i1, i2, j1, j2))
        else:
            pairs.extend((i, None) for i in range(i1, i2))
            pairs.extend((None, j) for j in range(j1, j2))
    return pairs


def _pair_changed(a: list[Any], b: list[Any], i1: int, i2: int, j1: int, j2: int
                  ) -> list[Pair]:
    """A stretch that differs: ops at the same place (kind and module call) pair up in order."""
    out: list[Pair] = []
    sub = SequenceMatcher(None, [_where(op) for op in a[i1:i2]],
                          [_where(op) for op in b[j1:j2]], autojunk=False)
    for tag, x1, x2, y1, y2 in sub.get_opcodes():
        if tag == "equal":
            out.extend(zip(range(i1 + x1, i1 + x2), range(j1 + y1, j1 + y2)))
        else:
            out.extend((i, None) for i in range(i1 + x1, i1 + x2))
            out.extend((None, j) for j in range(j1 + y1, j1 + y2))
    return out
