"""DOT source from a GraphView: nested clusters, HTML labels, theme colours. Pure string work."""

from __future__ import annotations

import html

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
    _emit(view, None, children, members, lines, 1)
    for edge in view.edges:
        label = f' [label="  {_quote(edge.label)}"]' if edge.label else ""
        lines.append(f"{INDENT}{edge.tail} -> {edge.head}{label};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _emit(view: GraphView, cluster_id: str | None, children: dict, members: dict,
          lines: list[str], level: int) -> None:
    """Write the nodes of one cluster (None: top level), then its child clusters, recursively."""
    pad = INDENT * level
    for node in members.get(cluster_id, ()):
        lines.append(f"{pad}{node.id} [{_node_attrs(view, node)}];")
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
        _emit(view, cluster.id, children, members, lines, level + 1)
        lines.append(f"{pad}}}")


def _node_attrs(view: GraphView, node: ViewNode) -> str:
    t = view.theme
    label = _bold(node.title) + "".join(
        f'<br/><font point-size="8" color="{t.muted_font}">{html.escape(line)}</font>'
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
    if node.edited:  # an edit fired here: a heavy orange dashed border, whatever the theme
        attrs += ['color="#e8710a"', "penwidth=3.5", 'style="' + _style(
            "rounded,dashed" if node.kind != "module" else "dashed", view.theme.filled) + '"']
    return ", ".join(attrs)


def _style(base: str, filled: bool) -> str:
    parts = [p for p in base.split(",") if p] + (["filled"] if filled else [])
    return ",".join(parts) or "solid"


def _bold(text: str) -> str:
    return f"<b>{html.escape(text)}</b>"


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
