"""Draw a Trace: check the dials, build the view, render it, and place the result."""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path
from typing import Any

from ..errors import TorchLensError
from . import output
from .build import build_view
from .drawing import Drawing
from .options import DIALS, DrawOptionError, DrawOptions, check_options, check_unknown
from .renderers import choose_renderer, renderer_formats


def draw_trace(trace: Any, *, collapse: str | int = "none", module: str | None = None,
               depth: int | None = None, theme: str = "light", direction: str = "TB",
               file_format: str | None = None, path: str | os.PathLike | None = None,
               open_viewer: bool = False, renderer: str | None = None,
               roll_recurrent: bool = False, fold: bool | None = None,
               node_budget: int | None = None, **unknown: Any) -> Drawing:
    """Render ``trace``'s graph and return a detached :class:`Drawing`.

    collapse: "none" (every op a node), "modules" (every innermost module call one node),
    "auto" (expand module levels while under ``node_budget`` nodes, fold repeated blocks), or
    an int (module calls at that depth become one node). module: draw only the ops inside that
    module address. depth: draw module clusters at most this deep. theme: light, dark, print.
    direction: TB, LR, BT, RL. file_format: pdf, svg, png, dot, or any a renderer adds.
    path: write there; otherwise a notebook shows it inline and a script writes a collision-safe
    ``<ModelClass>-graph.pdf`` in the current folder and prints the path. open_viewer: open the
    file in the system viewer (never by default). renderer: a renderer by name ("graphviz").
    roll_recurrent: draw the passes of a module called repeatedly as one node ("×3"). fold: fold
    consecutive identical sibling blocks (default: only with collapse="auto").
    """
    opts = validate_options(
        collapse=collapse, module=module, depth=depth, theme=theme, direction=direction,
        file_format=file_format, path=path, open_viewer=open_viewer, renderer=renderer,
        roll_recurrent=roll_recurrent, fold=fold, node_budget=node_budget, **unknown,
    )
    return _draw(trace, opts)


def validate_options(**options: Any) -> DrawOptions:
    """Check drawing keywords without a trace, so a surface can refuse before it captures."""
    known = {name: options.pop(name) for name in list(options) if name in DIALS}
    check_unknown(options)
    if known.get("node_budget", 0) is None:
        del known["node_budget"]
    return check_options(**known)


def render_drawing(trace: Any, *, receipt: Any = None, **options: Any) -> Drawing:
    """``draw_trace`` for surfaces that captured the trace themselves: records ``receipt``."""
    drawing = draw_trace(trace, **options)
    drawing.receipt = receipt
    return drawing


def _pick(opts: DrawOptions) -> tuple[str, type, str | None]:
    """Renderer name, class and file format from renderer=, file_format= and path='s suffix."""
    suffix = (Path(opts.path).suffix.lstrip(".").lower() or None) if opts.path else None
    if opts.file_format is not None or suffix is None:
        return (*choose_renderer(opts.renderer, opts.file_format), opts.file_format)
    if opts.renderer is not None:
        name, cls = choose_renderer(opts.renderer, None)
        return name, cls, suffix if suffix in renderer_formats(cls) else None
    try:  # the suffix picks the format, and the renderer that writes it (drawing.mmd)
        return (*choose_renderer(None, suffix), suffix)
    except DrawOptionError:  # an unknown suffix: write the default format under that name
        return (*choose_renderer(None, None), None)


def _draw(trace: Any, opts: DrawOptions) -> Drawing:
    name, cls, fmt = _pick(opts)
    notebook = output.in_notebook()
    fmt = fmt or _default_format(cls, notebook=notebook and opts.path is None)

    view = build_view(trace, opts)
    renderer = cls()
    source = renderer.build_source(view)
    model_class = trace.meta.get("model_class", "") or "model"
    drawing = Drawing(
        source=source, renderer=name, file_format=fmt, data=None, path=None,
        provenance=copy.deepcopy(dict(getattr(trace, "provenance", None) or {})),
        model_class=model_class, renderer_cls=cls,
        stats={"nodes": len(view.nodes), "edges": len(view.edges),
               "clusters": len(view.clusters), "folded": view.meta.get("folded", [])},
    )
    try:
        data = source.encode("utf-8") if fmt == cls.source_format else renderer.render(source, fmt)
    except TorchLensError as e:  # e.g. no dot: the source-only drawing can still be saved
        drawing.file_format = cls.source_format
        e.drawing = drawing  # type: ignore[attr-defined]
        raise

    written: Path | None = None
    if opts.path is not None:
        written = output.write_to(opts.path, data)
    elif not notebook:
        written = output.write_new(os.getcwd(), output.default_stem(model_class), fmt, data)
        print(f"TorchLens drawing written to {written}")
    if opts.open_viewer:
        if written is None:
            written = output.write_new(tempfile.gettempdir(), output.default_stem(model_class),
                                       fmt, data)
        output.open_viewer(written)
    drawing.data, drawing.path = data, written
    return drawing


def _default_format(cls: type, *, notebook: bool) -> str:
    """svg inline in a notebook, pdf in a file, else the renderer's first format or its source."""
    formats = tuple(getattr(cls, "file_formats", ()))
    for preferred in ("svg", "pdf") if notebook else ("pdf", "svg"):
        if preferred in formats:
            return preferred
    return formats[0] if formats else cls.source_format
