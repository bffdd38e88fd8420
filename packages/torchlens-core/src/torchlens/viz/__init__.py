"""Drawings of a Trace, renderer-agnostic: the graph view, collapsing, placement, ``Drawing``.

Renderers (graphviz in torchlens-viz, or any plugin) register through ``torchlens_renderers``;
nothing here imports graphviz.
"""

from __future__ import annotations

from ..units import format_shape
from .attention import save_patterns
from .build import build_view
from .draw import draw_trace, render_drawing, validate_options
from .drawing import Drawing
from .options import DIALS, DrawOptionError, check_options
from .renderers import Renderer, RendererError, available_renderers, choose_renderer
from .steps import draw_run
from .themes import THEMES, Theme
from .view import GraphView, ViewCluster, ViewEdge, ViewNode, format_count

__all__ = [
    "DIALS", "Drawing", "DrawOptionError", "GraphView", "Renderer", "RendererError", "THEMES",
    "Theme", "ViewCluster", "ViewEdge", "ViewNode", "available_renderers", "build_view",
    "check_options", "choose_renderer", "draw_trace", "format_count", "format_shape",
    "draw_run", "render_drawing", "save_patterns", "validate_options",
]
