"""The graph view: the plain nodes, edges and clusters every renderer draws (strings only).

A view is what is left of a Trace after collapsing, filtering and labelling. It holds no tensors
and no reference to the trace, so renderers (and the Drawing) never keep a capture alive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .themes import Theme

NODE_KINDS = ("input", "op", "output", "module", "boundary")


@dataclass
class ViewNode:
    """One drawn box.

    kind: "input" / "op" / "output" (an op of the trace), "module" (a collapsed module call or a
    fold of identical calls), "boundary" (a tensor entering or leaving a ``module=`` subgraph).
    title: the bold first line (op label, module address or "GPT2Block ×12"); lines: the rest
    (module type, "shape · params"). count: how many calls or passes the node stands for.
    cluster: id of the innermost cluster holding the node, None at top level.
    """

    id: str
    kind: str
    title: str
    lines: list[str] = field(default_factory=list)
    shape: str = ""
    params: int = 0
    count: int = 1
    cluster: str | None = None
    ops: int = 1
    edited: bool = False  # an edit (``edits=``) fired at this op or inside this call
    # the number the drawing is coloured by (a diff's relative difference, a gradient norm,
    # an overlay; a module: its largest; None: none), and in a diff, for an op, "matched",
    # "changed", "added" (second run only) or "removed" (first run only)
    metric: float | None = None
    status: str = ""


@dataclass
class ViewEdge:
    """A tensor flowing from ``tail`` to ``head`` (node ids); ``label`` is its shape."""

    tail: str
    head: str
    label: str = ""


@dataclass
class ViewCluster:
    """A labelled box around the nodes of one expanded module call (or a fold of calls)."""

    id: str
    title: str
    parent: str | None
    depth: int
    count: int = 1


@dataclass
class GraphView:
    """Everything a renderer needs: nodes and clusters in execution order, edges, looks."""

    title: str
    nodes: list[ViewNode]
    edges: list[ViewEdge]
    clusters: list[ViewCluster]
    theme: Theme
    direction: str = "TB"
    meta: dict[str, Any] = field(default_factory=dict)

    def node(self, node_id: str) -> ViewNode:
        """The node with id ``node_id``."""
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)

    def titles(self) -> list[str]:
        """Every node title, in order (handy in tests and reprs)."""
        return [node.title for node in self.nodes]


def edit_line(rows: list[dict[str, Any]]) -> str:
    """What an edited box says: the edit's kind and the norm of the change it made."""
    if len(rows) == 1:
        return f"EDITED {rows[0]['kind']} · change {rows[0]['norm']:.3g}"
    return f"EDITED ×{len(rows)} · largest change {max(r['norm'] for r in rows):.3g}"


def diff_line(d: dict[str, Any], names: tuple[str, str]) -> str:
    """What a diffed op's box says: on one side only, what changed, or how far apart."""
    if d["status"] == "removed":
        return f"REMOVED: only in {names[0]}"
    if d["status"] == "added":
        return f"ADDED: only in {names[1]}"
    head = "; ".join(d["changes"]) + " · " if d["changes"] else ""
    if d["values"] != "compared":
        return head + d["values"]
    if d["relative"] == 0 and d["max_abs"] == 0:
        return head + "equal"
    return head + f"Δ rel {d['text']['relative']} · cos {d['text']['cosine']}"


def largest_diff(diffs: list[dict[str, Any]]) -> tuple[float | None, str]:
    """The largest relative difference among ops and the box line saying where it is."""
    sides = [f"{n} {status}" for status in ("added", "removed")
             if (n := sum(d["status"] == status for d in diffs))]
    compared = [d for d in diffs if d["relative"] is not None]
    if not compared:
        return None, " · ".join(sides)
    worst = max(compared, key=lambda d: d["relative"])
    line = "all equal" if worst["relative"] == 0 else \
        f"largest Δ rel {worst['text']['relative']} at {worst['b']}"
    return worst["relative"], " · ".join([line, *sides])


def format_count(n: int) -> str:
    """A short parameter count: 950, 12.3K, 11.7M, 1.5B."""
    for size, suffix in ((1_000_000_000, "B"), (1_000_000, "M"), (1_000, "K")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(n)


def detail_line(shape: str, params: int, dtype: str | None = None) -> str:
    """The "shape · params" line under a node title."""
    parts = []
    if shape:
        parts.append(f"{shape} {dtype}" if dtype and dtype != "float32" else shape)
    if params:
        parts.append(f"{format_count(params)} params")
    return " · ".join(parts)
