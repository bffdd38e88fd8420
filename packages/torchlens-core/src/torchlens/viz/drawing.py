"""The Drawing: a detached result that owns its source and bytes, never the model or trace."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .output import write_to

_MIME = {"svg": "image/svg+xml", "png": "image/png", "pdf": "application/pdf",
         "jpg": "image/jpeg", "jpeg": "image/jpeg"}


class Drawing:
    """A rendered graph of one capture.

    source: the renderer's source text (DOT for graphviz); renderer: its name; file_format: the
    format of ``data`` (rendered bytes, or None) and of ``path`` (the file written, or None).
    provenance: a copy of the trace's input provenance; receipt: the state receipt of the surface
    that captured (None from ``Trace.draw``). Holds no tensors and no reference to the model or
    the trace, so ``save`` re-renders from ``source`` and never captures again.
    """

    def __init__(self, *, source: str, renderer: str, file_format: str, data: bytes | None = None,
                 path: Path | None = None, provenance: dict[str, Any] | None = None,
                 receipt: Any = None, model_class: str = "", stats: dict[str, Any] | None = None,
                 renderer_cls: type | None = None):
        self.source = source
        self.renderer = renderer
        self.file_format = file_format
        self.data = data
        self.path = path
        self.provenance = provenance if provenance is not None else {}
        self.receipt = receipt
        self.model_class = model_class
        self.stats = stats or {}
        self._renderer_cls = renderer_cls
        self._svg_cache: str | None = None

    # ---- files -------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, *, editable: bool = False,
             file_format: str | None = None) -> Path:
        """Write the drawing to ``path``, re-rendered from the source (no capture).

        The format is ``file_format``, else the path's suffix when the renderer writes it, else
        this drawing's format. ``editable=True`` writes the source text (DOT) itself, which needs
        no layout program.
        """
        if editable:
            return write_to(path, self.source.encode("utf-8"))
        fmt = (file_format or "").strip(". ").lower() or self._format_for(path)
        return write_to(path, self.render(fmt))

    def render(self, file_format: str) -> bytes:
        """The drawing as ``file_format`` bytes, rendered afresh from ``source``."""
        renderer = self._renderer()
        if file_format == renderer.source_format:
            return self.source.encode("utf-8")
        return renderer.render(self.source, file_format)

    def _format_for(self, path: str | os.PathLike) -> str:
        from .options import refuse
        from .renderers import renderer_formats

        suffix = Path(path).suffix.lstrip(".").lower()
        cls = self._renderer_class()
        known = renderer_formats(cls) if cls else ()
        if not suffix or suffix in known or cls is None:
            return suffix if suffix in known else self.file_format
        stem = Path(path).stem
        raise refuse(
            f"this {self.renderer} drawing writes {', '.join(known)}, not .{suffix} "
            f"(a drawing keeps no trace to re-draw it with another renderer)",
            [f'drawing.save("{stem}.{f}")' for f in known if f]
            + [f'trace.draw(path="{stem}.{suffix}")  (or tl.draw(model, x, path=...))'],
        )

    def _renderer_class(self) -> type | None:
        if self._renderer_cls is None:
            from .renderers import available_renderers

            self._renderer_cls = available_renderers().get(self.renderer)
        return self._renderer_cls

    def _renderer(self) -> Any:
        cls = self._renderer_class()
        if cls is None:
            from .renderers import choose_renderer

            cls = choose_renderer(self.renderer, None)[1]  # refuses renderer_unavailable
        return cls()

    # ---- notebooks ---------------------------------------------------------------------------
    def _svg(self) -> str | None:
        if self._svg_cache is None:
            if self.file_format == "svg" and self.data is not None:
                self._svg_cache = self.data.decode("utf-8")
            else:
                cls = self._renderer_class()
                if cls is None or "svg" not in getattr(cls, "file_formats", ()):
                    return None
                self._svg_cache = cls().render(self.source, "svg").decode("utf-8")
        return self._svg_cache

    def _repr_svg_(self) -> str | None:
        """Inline SVG for IPython / Jupyter (None when the renderer draws no SVG)."""
        try:
            return self._svg()
        except Exception:  # a display hook must not raise; repr() still says what this is
            return None

    def _repr_html_(self) -> str | None:
        """An html drawing inline: an iframe whose ``srcdoc`` is the whole page (no file)."""
        if self.file_format != "html":
            return None
        import html

        page = self.source if self.data is None else self.data.decode("utf-8")
        return (f'<iframe srcdoc="{html.escape(page, quote=True)}" title="TorchLens drawing" '
                'style="width:100%;height:640px;border:1px solid #d0d7de;border-radius:6px" '
                'sandbox="allow-scripts allow-downloads"></iframe>')

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        """Every representation Jupyter can show: the page, SVG or PNG, else the source."""
        bundle: dict[str, Any] = {"text/plain": repr(self)}
        page = self._repr_html_()
        if page is not None:
            bundle["text/html"] = page
            return bundle
        svg = self._repr_svg_()
        if svg is not None:
            bundle["image/svg+xml"] = svg
        elif self.file_format == "png" and self.data is not None:
            bundle["image/png"] = self.data
        else:
            bundle["text/plain"] += "\n" + self.source
        return bundle

    def __repr__(self) -> str:
        nodes, edges = self.stats.get("nodes"), self.stats.get("edges")
        size = f", {nodes} nodes, {edges} edges" if nodes is not None else ""
        if nodes is None and "ops" in self.stats:  # an interactive page: it holds every op
            size = f", {self.stats['ops']} ops"
        where = f"written to {self.path}" if self.path else (
            f"{len(self.data):,} bytes in memory" if self.data is not None else "source only")
        receipt = ", with receipt" if self.receipt is not None else ""
        return (f"<Drawing of {self.model_class or 'model'}: {self.renderer} "
                f"{self.file_format}{size}, {where}{receipt}>")
