"""Hook implementations of torchlens-viz, registered through the `torchlens` entry point."""

from __future__ import annotations

from torchlens import hookimpl


@hookimpl
def torchlens_renderers():
    """The graphviz renderer (imported only when drawing asks for renderers)."""
    from .renderer import GraphvizRenderer

    return {"graphviz": GraphvizRenderer}
