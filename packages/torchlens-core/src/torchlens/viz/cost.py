"""How hard a view is for a layered layout program (Graphviz ``dot``), estimated before layout.

``dot`` ranks nodes, threads every edge through one virtual node per rank it crosses, then
reorders each rank to cut crossings, which grows with the square of the rank's width. So a
graph of a few hundred nodes where one tensor feeds ops far down (an input read by every step
of a loop) can take a minute, while a chain of thousands takes a second. ``layout_cost`` is the
sum over ranks of (real + virtual nodes on the rank) squared: linear in nodes plus edge spans.
"""

from __future__ import annotations

from collections import defaultdict

from ..errors import DrawingTooLarge
from .view import GraphView

COST_PER_NODE = 20  # Σ width² allowed per node of max_nodes (≈ 8 s of dot at 70,000)


def layout_cost(view: GraphView) -> int:
    """Σ over ranks of (nodes + edges passing through the rank)², ranks by longest path."""
    ids = [node.id for node in view.nodes]
    index = {node_id: i for i, node_id in enumerate(ids)}
    heads: dict[str, list[str]] = defaultdict(list)
    indegree = dict.fromkeys(ids, 0)
    for edge in view.edges:
        if edge.tail in index and edge.head in index and \
                index[edge.tail] < index[edge.head]:  # forward edges only (no cycles)
            heads[edge.tail].append(edge.head)
            indegree[edge.head] += 1
    rank = dict.fromkeys(ids, 0)
    ready = [node_id for node_id in ids if indegree[node_id] == 0]
    while ready:
        node_id = ready.pop()
        for head in heads[node_id]:
            rank[head] = max(rank[head], rank[node_id] + 1)
            indegree[head] -= 1
            if indegree[head] == 0:
                ready.append(head)
    width: dict[int, int] = defaultdict(int)
    for node_id in ids:
        width[rank[node_id]] += 1
    spans = [0] * (max(rank.values(), default=0) + 2)
    for tail, targets in heads.items():  # difference array: +1 on every rank an edge crosses
        for head in targets:
            if rank[head] - rank[tail] > 1:
                spans[rank[tail] + 1] += 1
                spans[rank[head]] -= 1
    running = 0
    for r in range(len(spans)):
        running += spans[r]
        width[r] += running
    return sum(w * w for w in width.values())


def check_size(view: GraphView, max_nodes: int | None) -> None:
    """Refuse ``drawing_too_large`` when ``view`` has more than ``max_nodes`` nodes, or long
    edges that make its layout cost as much (``COST_PER_NODE × max_nodes``)."""
    if max_nodes is None:
        return
    nodes, cost = len(view.nodes), layout_cost(view)
    if nodes <= max_nodes and cost <= COST_PER_NODE * max_nodes:
        return
    ops = view.meta.get("ops", nodes)
    why = (f"{nodes:,} nodes (max_nodes={max_nodes:,})" if nodes > max_nodes else
           f"{nodes:,} nodes whose long edges cost dot as much as about "
           f"{cost // COST_PER_NODE:,} (max_nodes={max_nodes:,})")
    raise DrawingTooLarge(
        f"this static drawing of {ops:,} ops has {why}: Graphviz would take minutes to lay it "
        f"out, so it was not started (collapse={view.meta.get('collapse')!r})",
        teach=['file_format="html"  (one interactive page: lays out in the browser, expands '
               'on demand)', 'collapse="auto"  (or collapse=1, 2, ...: a drawing that fits)',
               "max_nodes=None  (accept the wait)"],
    )
