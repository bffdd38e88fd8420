"""The dials of a drawing: their names, defaults and checks, refused typed before any work."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import DrawOptionError
from .themes import THEMES, Theme

COLLAPSE_MODES = ("none", "modules", "auto")
DIRECTIONS = ("TB", "LR", "BT", "RL")
DEFAULT_NODE_BUDGET = 40
DEFAULT_MAX_NODES = 2000  # the largest static drawing handed to dot (see cost.py)

# Every keyword draw_trace takes, in the order the teach lists them.
DIALS = (
    "collapse", "module", "depth", "theme", "direction", "file_format", "path", "open_viewer",
    "renderer", "roll_recurrent", "fold", "node_budget", "max_nodes", "color", "overlay",
)
COLORS = ("grad_norm", "overlay")  # per-op numbers a drawing can be coloured by


@dataclass(frozen=True)
class DrawOptions:
    """Checked drawing dials (see ``draw_trace`` for what each means)."""

    collapse: str | int = "none"
    module: str | None = None
    depth: int | None = None
    theme: Theme = THEMES["light"]
    direction: str = "TB"
    file_format: str | None = None
    path: str | None = None
    open_viewer: bool = False
    renderer: str | None = None
    roll_recurrent: bool = False
    fold: bool = False
    node_budget: int = DEFAULT_NODE_BUDGET
    max_nodes: int | None = DEFAULT_MAX_NODES
    color: str | None = None
    overlay: Any = None  # ((label, value), ...) or a callable op -> value


def refuse(message: str, teach: list[str]) -> DrawOptionError:
    """A ``draw_option_invalid`` error (returned, for the caller to raise)."""
    return DrawOptionError(message, teach=teach)


def check_unknown(unknown: dict[str, Any]) -> None:
    """Refuse keywords no drawing surface takes, naming the valid dials."""
    if unknown:
        import difflib

        names = ", ".join(sorted(unknown))
        close = [m for name in unknown for m in difflib.get_close_matches(name, DIALS, n=1)]
        raise refuse(
            f"unknown drawing option(s): {names}. Valid dials: {', '.join(DIALS)}",
            [f"{name}=..." for name in close] + [f"valid dials: {', '.join(DIALS)}"],
        )


def _int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise refuse(f"{name}= must be an int >= {low}, got {value!r}", [f"{name}={max(low, 1)}"])
    return value


def check_options(*, collapse: Any = "none", module: Any = None, depth: Any = None,
                  theme: Any = "light", direction: Any = "TB", file_format: Any = None,
                  path: Any = None, open_viewer: Any = False, renderer: Any = None,
                  roll_recurrent: Any = False, fold: Any = None,
                  node_budget: Any = DEFAULT_NODE_BUDGET,
                  max_nodes: Any = DEFAULT_MAX_NODES, color: Any = None,
                  overlay: Any = None) -> DrawOptions:
    """Check every dial and return them normalized; ``fold=None`` means "only for auto"."""
    if isinstance(collapse, str):
        if collapse not in COLLAPSE_MODES:
            raise refuse(f"collapse= must be one of {COLLAPSE_MODES} or a module depth (int >= 1), "
                         f"got {collapse!r}", ['collapse="auto"', 'collapse="modules"',
                                               "collapse=2"])
    else:
        collapse = _int("collapse", collapse, 1)
    if module is not None and not isinstance(module, str):
        raise refuse(f"module= takes a module address such as 'layer1', got {module!r}",
                     ['module="layer1"', "list(trace.modules)"])
    if depth is not None:
        depth = _int("depth", depth, 0)
    if isinstance(theme, str):
        if theme not in THEMES:
            raise refuse(f"theme= must be one of {tuple(THEMES)}, got {theme!r}",
                         [f'theme="{name}"' for name in THEMES])
        theme = THEMES[theme]
    elif not isinstance(theme, Theme):
        raise refuse(f"theme= takes a theme name, got {theme!r}", ['theme="light"'])
    if not isinstance(direction, str) or direction.upper() not in DIRECTIONS:
        raise refuse(f"direction= must be one of {DIRECTIONS}, got {direction!r}",
                     ['direction="TB"', 'direction="LR"'])
    if file_format is not None:
        if not isinstance(file_format, str) or not file_format.strip(". "):
            raise refuse(f"file_format= takes a format name such as 'svg', got {file_format!r}",
                         ['file_format="svg"', 'file_format="pdf"', 'file_format="dot"'])
        file_format = file_format.strip(". ").lower()
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise refuse(f"path= takes a file path, got {path!r}", ['path="model.pdf"'])
        path = os.fspath(path)
    if renderer is not None and not isinstance(renderer, str):
        raise refuse(f"renderer= takes a renderer name, got {renderer!r}",
                     ['renderer="graphviz"'])
    for name, value in (("open_viewer", open_viewer), ("roll_recurrent", roll_recurrent)):
        if not isinstance(value, bool):
            raise refuse(f"{name}= takes True or False, got {value!r}", [f"{name}=True"])
    if fold is not None and not isinstance(fold, bool):
        raise refuse(f"fold= takes True, False or None, got {fold!r}", ["fold=True"])
    if overlay is not None:
        if isinstance(overlay, dict):
            if not all(isinstance(k, str) and isinstance(v, (int, float)) and
                       not isinstance(v, bool) for k, v in overlay.items()):
                raise refuse("overlay= takes {op label: number} or a callable op -> number",
                             ['overlay={"conv2d_1": 0.5}', "overlay=lambda op: op.flops"])
            overlay = tuple(overlay.items())
        elif not callable(overlay):
            raise refuse(f"overlay= takes {{op label: number}} or a callable, got {overlay!r}",
                         ['overlay={"conv2d_1": 0.5}', "overlay=lambda op: op.flops"])
        color = "overlay" if color is None else color
        if not isinstance(color, str) or not color.strip():
            raise refuse(f"with overlay=, color= names the numbers (the legend), got {color!r}",
                         ['overlay=scores, color="attribution score"'])
    if color is not None and color not in COLORS and overlay is None:
        raise refuse(f"color= must be one of {COLORS}, got {color!r}",
                     [f'color="{name}"' for name in COLORS])
    if color == "overlay" and overlay is None:
        raise refuse('color="overlay" needs overlay= (the numbers to colour by)',
                     ['overlay={"conv2d_1": 0.5}', 'color="grad_norm"'])
    return DrawOptions(
        collapse=collapse, module=module, depth=depth, theme=theme,
        direction=direction.upper(), file_format=file_format, path=path,
        open_viewer=open_viewer, renderer=renderer, roll_recurrent=roll_recurrent,
        fold=(collapse == "auto") if fold is None else fold,
        node_budget=_int("node_budget", node_budget, 1),
        max_nodes=None if max_nodes is None else _int("max_nodes", max_nodes, 1),
        color=color, overlay=overlay,
    )
