"""Numbers for people: counts with a K/M/G/T suffix and tensor shapes, shared by every table
and message."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def human(n: float | None, unit: str = "", digits: int = 2) -> str:
    """``1234567`` -> ``1.23M`` (``digits`` after the point); ``--`` when unknown."""
    if n is None:
        return "--"
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f}{suffix}{unit}"
    return f"{n:g}{unit}"


def format_shape(shape: Sequence[int | None] | None, *, unknown: str = "--") -> str:
    """``(1, 3, 224)`` -> ``1×3×224``; ``()`` -> ``scalar``; a ragged dim ``?``; None ``--``."""
    if shape is None:
        return unknown
    if len(shape) == 0:
        return "scalar"
    return "×".join("?" if d is None else str(d) for d in shape)


def format_shapes(shapes: Iterable[Sequence[int | None] | None], most: int | None = None) -> str:
    """Shapes as ``1×8, 2×8``: the first ``most`` then ``...``; ``--`` when there are none."""
    shapes = list(shapes)
    shown = shapes if most is None else shapes[:most]
    text = ", ".join(format_shape(s) for s in shown)
    return (text + (", ..." if len(shown) < len(shapes) else "")) or "--"
