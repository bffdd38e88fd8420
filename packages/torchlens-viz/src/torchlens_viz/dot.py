"""DOT source from a GraphView: nested clusters, HTML labels, theme colours. Pure string work."""

from __future__ import annotations

import html
import math

from torchlens.viz import GraphView, ViewCluster, ViewNode

INDENT = "  "


def build_dot(view: GraphView) -> str:
    """The whole DOT document for ``view``, deterministic for a given view."""
    t = view.theme
    lines = [
        "digraph torchlens {",
        f'{INDENT}graph [rankdir={view.direction}, bgcolor="{t.background}", '
        f'fontname="{t.fontname}", fontcolor="{t.font}", fontsize=14, '
        f"label=<{_bold(view.title)}>, labelloc=t, labeljust=l, newrank=true, "
        'nodesep=0.3, ranksep=0.3, pad=0.25, outputorder=edgesfirst];',
        f'{INDENT}node [shape=box, style="{_style("rounded", t.filled)}", '
        f'fontname="{t.fontname}", fontsize=10, fontcolor="{t.font}", color="{t.node_border}", '
        f'fillcolor="{t.node_fill}", margin="0.10,0.04", height=0.3, penwidth=0.8];',
        f'{INDENT}edge [color="{t.edge}", fontcolor="{t.edge_font}", fontname="{t.fontname}", '
        "fontsize=8, arrowsize=0.6, penwidth=0.8];",
    ]
    children: dict[str | None, list[ViewCluster]] = {}
    for cluster in view.clusters:
        children.setdefault(cluster.parent, []).append(cluster)
    members: dict[str | None, list[ViewNode]] = {}
    for node in view.nodes:
        members.setdefault(node.cluster, []).append(node)
    _emit(view, None, children, members, lines, 1, _diff_scale(view))
    for edge in view.edges:
        label = f' [label="  {_quote(edge.label)}"]' if edge.label else ""
        lines.append(f"{INDENT}{edge.tail} -> {edge.head}{label};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _emit(view: GraphView, cluster_id: str | None, children: dict, members: dict,
          lines: list[str], level: int, scale: tuple[float, float] | None) -> None:
    """Write the nodes of one cluster (None: top level), then its child clusters, recursively."""
    pad = INDENT * level
    for node in members.get(cluster_id, ()):
        lines.append(f"{pad}{node.id} [{_node_attrs(view, node, scale)}];")
    for cluster in children.get(cluster_id, ()):
        t = view.theme
        folded = cluster.count > 1  # one copy standing for N: tinted, with a heavier border
        fill = t.fold_fill if folded else t.cluster_fill(cluster.depth)
        style = _style("rounded", t.filled) + ("" if t.filled else ",dashed")
        width = 2.0 if folded else 1.0
        lines.append(f"{pad}subgraph cluster_{cluster.id} {{")
        lines.append(
            f'{pad}{INDENT}graph [label=<{_bold(cluster.title)}>, style="{style}", '
            f'fillcolor="{fill}", color="{t.cluster_border}", fontsize=10, labeljust=l, '
            f'fontcolor="{t.muted_font}", margin=8, penwidth={width}];'
        )
        _emit(view, cluster.id, children, members, lines, level + 1, scale)
        lines.append(f"{pad}}}")


def _node_attrs(view: GraphView, node: ViewNode, scale: tuple[float, float] | None = None
                ) -> str:
    t = view.theme
    diff = _diff_attrs(view, node, scale) if "metric" in view.meta or "diff" in view.meta \
        else []
    muted = "#ffffff" if 'fontcolor="#ffffff"' in diff else t.muted_font
    label = _bold(node.title) + "".join(
        f'<br/><font point-size="8" color="{muted}">{html.escape(line)}</font>'
        for line in node.lines
    )
    attrs = [f"label=<{label}>"]
    if node.kind == "module":
        shape = "box3d" if node.count > 1 else "box"
        attrs += [f"shape={shape}", f'style="{_style("", t.filled)}"',
                  f'fillcolor="{t.fold_fill if node.count > 1 else t.module_fill}"',
                  "penwidth=1.2"]
    elif node.kind == "input":
        attrs.append(f'fillcolor="{t.input_fill}"')
    elif node.kind == "output":
        attrs.append(f'fillcolor="{t.output_fill}"')
    elif node.kind == "boundary":
        attrs.append(f'style="{_style("rounded,dashed", t.filled)}"')
    elif node.count > 1:
        attrs.append(f'fillcolor="{t.fold_fill}"')
    attrs += diff
    if node.edited:  # an edit fired here: a heavy orange dashed border, whatever the theme
        attrs += ['color="#e8710a"', "penwidth=3.5", 'style="' + _style(
            "rounded,dashed" if node.kind != "module" else "dashed", view.theme.filled) + '"']
    return ", ".join(attrs)


DIFF_RAMP = ("#fff1e0", "#fd8d3c", "#a63603")  # light to dark: small to large differences
STATUS_BORDER = {"added": "#1a7f37", "removed": "#cf222e", "changed": "#8250df"}


def _diff_scale(view: GraphView) -> tuple[float, float] | None:
    """log10 of the smallest and largest nonzero magnitude drawn (None: nothing to colour)."""
    values = [abs(n.metric) for n in view.nodes if n.metric]
    return (math.log10(min(values)), math.log10(max(values))) if values else None


def _diff_attrs(view: GraphView, node: ViewNode, scale: tuple[float, float] | None
                ) -> list[str]:
    """A coloured drawing (a diff, gradient norms, an overlay): the fill by the node's number
    (log scale of its magnitude over the drawing; none or zero: the theme's fill), and in a
    diff a dashed border for ops on one side only."""
    attrs = []
    if node.metric and scale:
        lo, hi = scale
        t = (math.log10(abs(node.metric)) - lo) / (hi - lo) if hi > lo else 1.0
        fill = _mix(*DIFF_RAMP[:2], t * 2) if t < 0.5 else _mix(*DIFF_RAMP[1:], t * 2 - 1)
        attrs.append(f'fillcolor="{fill}"')
        if t > 0.6:
            attrs.append('fontcolor="#ffffff"')
    border = STATUS_BORDER.get(node.status)
    if border:
        dashed = "dashed" if node.status != "changed" else ""
        attrs += [f'color="{border}"', "penwidth=2.5", 'style="' + _style(
            ",".join(p for p in ("rounded", dashed) if p), view.theme.filled) + '"']
    return attrs


def _mix(a: str, b: str, t: float) -> str:
    x, y = (int(a[i:i + 2], 16) for i in (1, 3, 5)), (int(b[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(u + (v - u) * t):02x}" for u, v in zip(x, y))


def _style(base: str, filled: bool) -> str:
    parts = [p for p in base.split(",") if p] + (["filled"] if filled else [])
    return ",".join(parts) or "solid"


def _bold(text: str) -> str:
    return f"<b>{html.escape(text)}</b>"


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
