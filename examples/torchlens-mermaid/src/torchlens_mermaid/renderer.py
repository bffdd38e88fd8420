"""MermaidRenderer: a GraphView as a Mermaid flowchart, nested subgraphs for module clusters."""

from __future__ import annotations

from torchlens.viz import GraphView, Renderer, ViewNode

MERMAID_THEMES = {"light": "default", "dark": "dark", "print": "neutral"}
# node kind → (opening, closing) bracket of the Mermaid node shape
SHAPES = {"input": ("([", "])"), "output": ("([", "])"), "module": ("[[", "]]"),
          "boundary": ("[/", "/]"), "op": ("(", ")")}


class MermaidRenderer(Renderer):
    """Writes ``.mmd`` text; there is nothing to lay out, so the source is the file."""

    name = "mermaid"
    source_format = "mmd"
    file_formats = ()

    def build_source(self, view: GraphView) -> str:
        t = view.theme
        lines = [
            f'%%{{init: {{"theme": "{MERMAID_THEMES.get(t.name, "default")}"}}}}%%',
            f"flowchart {view.direction}",
            f"  %% {_text(view.title)}",
        ]
        nested: dict[str | None, list] = {}
        for cluster in view.clusters:
            nested.setdefault(cluster.parent, []).append(cluster)
        members: dict[str | None, list[ViewNode]] = {}
        for node in view.nodes:
            members.setdefault(node.cluster, []).append(node)
        self._emit(None, nested, members, lines, 1)
        for edge in view.edges:
            label = f'|"{_text(edge.label)}"|' if edge.label else ""
            lines.append(f"  {edge.tail} -->{label} {edge.head}")
        lines += [
            f"  classDef input fill:{t.input_fill},stroke:{t.node_border},color:{t.font}",
            f"  classDef output fill:{t.output_fill},stroke:{t.node_border},color:{t.font}",
            f"  classDef module fill:{t.module_fill},stroke:{t.node_border},color:{t.font}",
        ]
        for kind in ("input", "output", "module"):
            ids = [node.id for node in view.nodes if node.kind == kind]
            if ids:
                lines.append(f"  class {','.join(ids)} {kind}")
        return "\n".join(lines) + "\n"

    def _emit(self, cluster_id, nested, members, lines, level) -> None:
        pad = "  " * level
        for node in members.get(cluster_id, ()):
            left, right = SHAPES.get(node.kind, SHAPES["op"])
            text = "<br/>".join([f"<b>{_text(node.title)}</b>", *map(_text, node.lines)])
            lines.append(f'{pad}{node.id}{left}"{text}"{right}')
        for cluster in nested.get(cluster_id, ()):
            lines.append(f'{pad}subgraph {cluster.id}["{_text(cluster.title)}"]')
            self._emit(cluster.id, nested, members, lines, level + 1)
            lines.append(f"{pad}end")


def _text(text: str) -> str:
    """Escape the characters Mermaid treats specially inside a quoted label."""
    return text.replace('"', "#quot;").replace("<", "#lt;").replace(">", "#gt;")
