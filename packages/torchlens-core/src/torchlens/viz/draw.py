"""Draw a Trace: check the dials, build the view, render it, and place the result."""

from __future__ import annotations

import copy
import os
import tempfile
from pathlib import Path
from typing import Any

from ..capabilities import provide
from ..errors import TorchLensError
from . import output
from .build import build_view
from .cost import check_size
from .drawing import Drawing
from .options import (
    DEFAULT_MAX_NODES,
    DIALS,
    DrawOptionError,
    DrawOptions,
    check_options,
    check_unknown,
)
from .page import build_page
from .renderers import available_renderers, choose_renderer, renderer_formats


@provide("draw")
def draw_trace(trace: Any, *, collapse: str | int = "none", module: str | None = None,
               depth: int | None = None, theme: str = "light", direction: str = "TB",
               file_format: str | None = None, path: str | os.PathLike | None = None,
               open_viewer: bool = False, renderer: str | None = None,
               roll_recurrent: bool = False, fold: bool | None = None,
               node_budget: int | None = None, max_nodes: int | None = DEFAULT_MAX_NODES,
               color: str | None = None, overlay: Any = None, **unknown: Any) -> Drawing:
    """Render ``trace``'s graph and return a detached :class:`Drawing`.

    collapse: "none" (every op a node), "modules" (every innermost module call one node),
    "auto" (expand module levels while under ``node_budget`` nodes, fold repeated blocks), or
    an int (module calls at that depth become one node). module: draw only the ops inside that
    module address. depth: draw module clusters at most this deep. theme: light, dark, print.
    direction: TB, LR, BT, RL. file_format: pdf, svg, png, dot, html, or any a renderer adds;
    without it, path='s suffix picks the format. path: write there; otherwise a notebook shows
    it inline and a script writes a collision-safe ``<ModelClass>-graph.pdf`` in the current
    folder and prints the path. open_viewer: open the file in the system viewer (never by
    default). renderer: a renderer by name ("graphviz", "html"). roll_recurrent: draw the passes
    of a module called repeatedly as one node ("×3"). fold: fold consecutive identical sibling
    blocks and repeated op sequences (default: only with collapse="auto"). node_budget: the node
    count collapse="auto" keeps to. max_nodes: the largest static drawing handed to a layout
    program such as dot (None: no limit, accept the wait); larger ones refuse
    ``drawing_too_large`` before layout. color: "grad_norm" (each op's gradient norm, after
    ``trace.backward``); overlay: your own number per op, ``{label: value}`` or a callable
    ``op -> value`` (None: uncoloured), with color= its name in the legend ("attribution
    score"; default "overlay"); a module shows its largest.
    """
    opts = validate_options(
        collapse=collapse, module=module, depth=depth, theme=theme, direction=direction,
        file_format=file_format, path=path, open_viewer=open_viewer, renderer=renderer,
        roll_recurrent=roll_recurrent, fold=fold, node_budget=node_budget,
        max_nodes=max_nodes, color=color, overlay=overlay, **unknown,
    )
    return draw_with_pages(trace, opts)


def validate_options(**options: Any) -> DrawOptions:
    """Check drawing keywords without a trace, so a surface can refuse before it captures:
    the dials, and the renderer and format that renderer=, file_format= and path= ask for."""
    known = {name: options.pop(name) for name in list(options) if name in DIALS}
    check_unknown(options)
    if known.get("node_budget", 0) is None:
        del known["node_budget"]
    opts = check_options(**known)
    _pick(opts)
    return opts


def render_drawing(trace: Any, *, receipt: Any = None, **options: Any) -> Drawing:
    """``draw_trace`` for surfaces that captured the trace themselves: records ``receipt``."""
    drawing = draw_trace(trace, **options)
    drawing.receipt = receipt
    return drawing


def _pick(opts: DrawOptions) -> tuple[str, type, str | None]:
    """Renderer name, class and file format from renderer=, file_format= and path='s suffix.

    Without file_format= the suffix decides; a suffix no installed renderer writes, or one that
    disagrees with file_format=, refuses (naming what each renderer writes).
    """
    suffix = (Path(opts.path).suffix.lstrip(".").lower() or None) if opts.path else None
    if suffix is None:
        return (*choose_renderer(opts.renderer, opts.file_format), opts.file_format)
    if opts.file_format is not None and opts.file_format != suffix:
        raise _refuse_suffix(opts, suffix, f"disagrees with file_format={opts.file_format!r}")
    if opts.renderer is not None:
        name, cls = choose_renderer(opts.renderer, None)
        if suffix not in renderer_formats(cls):
            raise _refuse_suffix(opts, suffix, f"is not a format renderer={name!r} writes")
        return name, cls, suffix
    try:
        return (*choose_renderer(opts.renderer, suffix), suffix)
    except DrawOptionError:
        raise _refuse_suffix(opts, suffix, "is a format no installed renderer writes") from None


def _refuse_suffix(opts: DrawOptions, suffix: str, why: str) -> DrawOptionError:
    renderers = available_renderers()
    writes = "; ".join(f"{name} writes {', '.join(f for f in renderer_formats(cls) if f)}"
                       for name, cls in sorted(renderers.items()))
    stem = Path(opts.path).stem if opts.path else "graph"
    fmts = [opts.file_format] if opts.file_format else sorted(
        {f for cls in renderers.values() for f in renderer_formats(cls) if f})
    return DrawOptionError(
        f"path={opts.path!r}: the suffix .{suffix} {why} ({writes})",
        teach=[f'path="{stem}.{f}"' for f in fmts[:6]] + ["or drop file_format= and let the "
                                                          "suffix decide"],
    )


def draw_with_pages(trace: Any, opts: DrawOptions, pages: Any = None) -> Drawing:
    """``pages``: ``opts -> PageModel`` for an interactive renderer, when the caller builds the
    page itself (a step run's page holds every step)."""
    name, cls, fmt = _pick(opts)
    notebook = output.in_notebook()
    fmt = fmt or _default_format(cls, notebook=notebook and opts.path is None)

    renderer = cls()
    page = None
    if getattr(cls, "interactive", False):  # lays the graph out itself, from the whole model
        page = pages(opts) if pages is not None else build_page(trace, opts)
        source = renderer.build_source(page)
        stats = {"ops": page.ops, "calls": len(page.data["calls"]),
                 "groups": len(page.data["groups"])}
    else:
        view = build_view(trace, opts)
        if fmt != cls.source_format and getattr(cls, "lays_out", False):
            check_size(view, opts.max_nodes)  # before dot starts, never after a long wait
        source = renderer.build_source(view)
        stats = {"nodes": len(view.nodes), "edges": len(view.edges),
                 "clusters": len(view.clusters), "folded": view.meta.get("folded", [])}
    model_class = trace.meta.get("model_class", "") or "model"
    drawing = Drawing(
        source=source, renderer=name, file_format=fmt, data=None, path=None,
        provenance=copy.deepcopy(dict(getattr(trace, "provenance", None) or {})),
        model_class=model_class, renderer_cls=cls, stats=stats,
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
