"""Renderer backends: the interface, and lookup through the ``torchlens_renderers`` hook."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ..errors import RendererError, TorchLensError
from .options import refuse
from .view import GraphView

DEFAULT_RENDERER = "graphviz"


class Renderer(ABC):
    """A drawing backend: turns a GraphView into source text, and source text into file bytes.

    A whole third-party renderer, in a package with an entry point in the ``torchlens`` group::

        import torchlens
        from torchlens.viz import Renderer

        class MermaidRenderer(Renderer):
            name = "mermaid"
            source_format = "mmd"          # the source text is itself a file of this format

            def build_source(self, view):
                return "flowchart TB\\n" + "".join(f"  {n.id}[{n.title}]\\n" for n in view.nodes)

        @torchlens.hookimpl
        def torchlens_renderers():
            return {"mermaid": MermaidRenderer}

    ``file_formats`` lists what ``render`` can produce besides the source; the first of
    ``preferred_formats`` it supports is used when nobody names a format.

    ``lays_out = True`` says ``render`` runs a layout program whose time grows fast with the
    graph (dot): drawings past ``max_nodes=`` then refuse ``drawing_too_large`` before it
    starts. ``interactive = True`` says the renderer lays out and toggles the graph itself:
    ``build_source`` then gets a :class:`~torchlens.viz.page.PageModel` (the whole view model,
    every fold and call, with the starting state) instead of a one-state GraphView.
    """

    name: ClassVar[str] = ""
    source_format: ClassVar[str] = ""
    file_formats: ClassVar[tuple[str, ...]] = ()
    lays_out: ClassVar[bool] = False
    interactive: ClassVar[bool] = False

    @abstractmethod
    def build_source(self, view: GraphView) -> str:
        """The renderer's source text (DOT, Mermaid, HTML ...) for ``view``."""

    def render(self, source: str, file_format: str) -> bytes:
        """Bytes of ``source`` drawn as ``file_format`` (one of ``file_formats``)."""
        raise RendererError(f"renderer {self.name!r} cannot produce {file_format!r}",
                            code="render_failed", teach=[f'file_format="{self.source_format}"'])

    @classmethod
    def formats(cls) -> tuple[str, ...]:
        """Every file format this renderer writes: its source format first."""
        return (cls.source_format, *cls.file_formats)


def qualname(cls: Any) -> str:
    """``package.module.Class`` for error messages."""
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"


def available_renderers(plugin_manager: Any = None) -> dict[str, type]:
    """Every renderer the installed plugins register, by name; clashes refuse ``plugin_invalid``."""
    from ..plugins import get_plugin_manager

    pm = plugin_manager or get_plugin_manager()
    found: dict[str, type] = {}
    owner: dict[str, str] = {}
    for impl in pm.hook.torchlens_renderers.get_hookimpls():  # in registration order
        mapping = impl.function()
        if not hasattr(mapping, "items"):
            raise TorchLensError(
                f"plugin {impl.plugin_name!r}: torchlens_renderers() must return a mapping of "
                f"name to renderer class, got {type(mapping).__name__}",
                code="plugin_invalid", teach=['return {"myrenderer": MyRenderer}'],
            )
        for name, cls in mapping.items():
            if not (isinstance(cls, type) and callable(getattr(cls, "build_source", None))):
                raise TorchLensError(
                    f"plugin {impl.plugin_name!r}: renderer {name!r} is {cls!r}, not a class "
                    "with build_source(view)", code="plugin_invalid",
                    teach=["subclass torchlens.viz.Renderer"],
                )
            if name in found and found[name] is not cls:
                raise TorchLensError(
                    f"two plugins register a renderer named {name!r}: {qualname(found[name])} "
                    f"(plugin {owner[name]!r}) and {qualname(cls)} (plugin {impl.plugin_name!r})",
                    code="plugin_invalid",
                    teach=[f"pip uninstall one of the packages providing {name!r}",
                           "tl.plugins.list_plugins()"],
                )
            found[name], owner[name] = cls, impl.plugin_name
    return found


def renderer_formats(cls: type) -> tuple[str, ...]:
    """Every format a renderer class writes, its source format first (duck-typed)."""
    return (getattr(cls, "source_format", ""), *getattr(cls, "file_formats", ()))


def choose_renderer(name: str | None, file_format: str | None) -> tuple[str, type]:
    """The renderer (name, class) for a name and/or a file format; graphviz first on a tie."""
    renderers = available_renderers()
    if not renderers:
        raise RendererError(
            "no renderer is installed: drawing needs a renderer plugin such as torchlens-viz",
            code="renderer_unavailable", teach=["pip install torchlens-viz"],
        )
    if name is not None:
        if name not in renderers:
            raise RendererError(
                f"no renderer named {name!r} is installed; installed: {sorted(renderers)}",
                code="renderer_unavailable",
                teach=[f'renderer="{n}"' for n in sorted(renderers)]
                + ["pip install torchlens-viz"],
            )
        cls = renderers[name]
        if file_format is not None and file_format not in renderer_formats(cls):
            raise refuse(f"renderer {name!r} writes {renderer_formats(cls)}, not {file_format!r}",
                         [f'file_format="{f}"' for f in renderer_formats(cls)])
        return name, cls
    order = sorted(renderers, key=lambda n: (n != DEFAULT_RENDERER, n))
    if file_format is None:
        return order[0], renderers[order[0]]
    for candidate in order:
        if file_format in renderer_formats(renderers[candidate]):
            return candidate, renderers[candidate]
    every = sorted({f for cls in renderers.values() for f in renderer_formats(cls) if f})
    raise refuse(f"no installed renderer writes file_format={file_format!r}; formats: {every}",
                 [f'file_format="{f}"' for f in every])
