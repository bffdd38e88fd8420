"""The graphviz renderer: DOT source, laid out by Graphviz's ``dot`` via the graphviz package."""

from __future__ import annotations

import subprocess

from torchlens.viz import GraphView, Renderer, RendererError

from .dot import build_dot

INSTALL_TEACH = [
    "apt-get install -y graphviz  (Debian/Ubuntu)",
    "brew install graphviz  (macOS)",
    "conda install -c conda-forge graphviz  (conda)",
    'drawing.save("graph.dot", editable=True)  (writes the DOT source; works without dot)',
    'file_format="dot"  (draw to DOT source now, lay it out later)',
]


class GraphvizRenderer(Renderer):
    """Writes DOT; renders PDF, SVG and PNG with ``dot`` (PNG at ``png_dpi``)."""

    name = "graphviz"
    source_format = "dot"
    file_formats = ("pdf", "svg", "png")
    lays_out = True
    png_dpi = 96

    def build_source(self, view: GraphView) -> str:
        """The DOT source of the view."""
        return build_dot(view)

    def render(self, source: str, file_format: str) -> bytes:
        """The DOT source laid out by Graphviz's ``dot`` in ``file_format``."""
        if file_format in ("dot", "gv"):
            return source.encode("utf-8")
        if file_format not in self.file_formats:
            return super().render(source, file_format)
        if file_format == "png":
            source = _with_graph_attr(source, f"dpi={self.png_dpi}")
        return run_dot(source, file_format)


def run_dot(source: str, file_format: str) -> bytes:
    """Lay out ``source`` with ``dot``; refuse typed when it is missing or fails."""
    import graphviz

    try:
        return graphviz.pipe("dot", file_format, source.encode("utf-8"), quiet=True)
    except graphviz.ExecutableNotFound as e:
        raise RendererError(
            f"Graphviz's dot program was not found on PATH, so the drawing cannot be laid out "
            f"as {file_format}",
            code="graphviz_not_found", teach=INSTALL_TEACH,
        ) from e
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or b"").decode("utf-8", "replace").strip()[-500:]
        raise RendererError(
            f"dot failed to render {file_format}: {tail or e}", code="render_failed",
            teach=['drawing.save("graph.dot", editable=True)', 'file_format="svg"'],
        ) from e


def _with_graph_attr(source: str, attr: str) -> str:
    """``source`` with a graph attribute added right after the opening brace."""
    head, brace, rest = source.partition("{")
    return f"{head}{brace}\n  graph [{attr}];{rest}"
