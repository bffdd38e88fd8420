"""Hook implementations of torchlens-viz, registered through the `torchlens` entry point."""

from __future__ import annotations

from torchlens import hookimpl


@hookimpl
def torchlens_renderers():
    """The graphviz and html renderers (imported only when drawing asks for renderers)."""
    from .html import HtmlRenderer
    from .renderer import GraphvizRenderer

    return {"graphviz": GraphvizRenderer, "html": HtmlRenderer}
