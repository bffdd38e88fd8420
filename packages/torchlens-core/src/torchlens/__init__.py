"""TorchLens: see inside a PyTorch model in one line.

``tl.trace(model, x)`` records every op of the forward pass; ``tl.load`` reads a saved trace.
Importing torchlens changes nothing in torch.
"""

from __future__ import annotations

from .anatomy import transformer  # noqa: E402
from .compare import compare  # noqa: E402
from .errors import TorchLensError, TorchLensWarning  # noqa: E402
from .hookspecs import hookimpl  # noqa: E402
from .recording import record  # noqa: E402
from .steps import steps  # noqa: E402
from .summary import Summary  # noqa: E402
from .trace import Module, ModuleCall, Op, Trace  # noqa: E402
from .verbs import draw, generate, load, summary, trace  # noqa: E402
from .version import __version__  # noqa: E402,F401

__all__ = [
    "Module", "ModuleCall", "Op", "Trace", "TorchLensError", "TorchLensWarning", "hookimpl",
    "Summary", "compare", "draw", "generate", "load", "record", "steps", "summary",
    "trace", "transformer",
]
SUBMODULES = ("debug", "types", "viz", "recording", "validation", "plugins", "errors", "edits",
              "sites", "patching", "grads", "attribution", "catalogue")


def __getattr__(name: str):
    """Lazy submodules (``tl.debug``, ``tl.viz``, ...) import on first use."""
    if name in SUBMODULES:
        import importlib

        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
