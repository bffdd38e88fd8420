"""Numbers for people: counts with a K/M/G/T suffix, shared by every table and message."""

from __future__ import annotations


def human(n: float | None, unit: str = "", digits: int = 2) -> str:
    """``1234567`` -> ``1.23M`` (``digits`` after the point); ``--`` when unknown."""
    if n is None:
        return "--"
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f}{suffix}{unit}"
    return f"{n:g}{unit}"
