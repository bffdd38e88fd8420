"""Graph helpers the tests share."""

from __future__ import annotations


def descendants(trace, label: str) -> set[str]:
    """Every op downstream of ``label`` in ``trace``."""
    out, todo = set(), [label]
    while todo:
        for child in trace[todo.pop()].children or ():
            if child not in out:
                out.add(child)
                todo.append(child)
    return out
