"""Where a drawing goes: inline in a notebook, a collision-safe file in a script, or ``path=``.

Files in the current folder are claimed with ``O_CREAT | O_EXCL``, so two processes drawing the
same model at once get ``Model-graph.pdf`` and ``Model-graph-1.pdf``, never one overwriting the
other. No viewer is ever opened unless the caller passed ``open_viewer=True``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

MAX_SUFFIX = 10_000


def in_notebook() -> bool:
    """True inside a running IPython kernel (Jupyter, VS Code notebooks), never in a terminal."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # an IPython too broken to ask is not a notebook
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None


def default_stem(model_class: str) -> str:
    """``<ModelClass>-graph``, with characters unsafe in file names replaced."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model_class or "model").strip("._") or "model"
    return f"{safe}-graph"


def write_new(directory: str | os.PathLike, stem: str, suffix: str, data: bytes) -> Path:
    """Write ``data`` to the first free ``stem.suffix``, ``stem-1.suffix``, … in ``directory``."""
    folder = Path(directory)
    for i in range(MAX_SUFFIX):
        candidate = folder / (f"{stem}.{suffix}" if i == 0 else f"{stem}-{i}.{suffix}")
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return candidate.resolve()
    raise FileExistsError(f"{folder}/{stem}-*.{suffix}: {MAX_SUFFIX} names already taken")


def write_to(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to exactly ``path`` (the caller named it, so replacing it is asked for)."""
    target = Path(path)
    target.write_bytes(data)
    return target.resolve()


def open_viewer(path: str | os.PathLike) -> None:
    """Open ``path`` in the system viewer without waiting for it."""
    target = os.fspath(path)
    if sys.platform.startswith("win"):
        os.startfile(target)  # type: ignore[attr-defined]  # noqa: S606
        return
    opener = "open" if sys.platform == "darwin" else "xdg-open"
    subprocess.Popen([opener, target], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
