"""TorchLens: see inside a PyTorch model in one line.

``tl.trace(model, x)`` records every op of the forward pass; ``tl.load`` reads a saved trace.
Importing torchlens changes nothing in torch.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .compare import compare  # noqa: E402
from .errors import TorchLensError, TorchLensWarning  # noqa: E402
from .hookspecs import hookimpl  # noqa: E402
from .recording import record  # noqa: E402
from .steps import steps  # noqa: E402
from .summary import Summary  # noqa: E402
from .trace import Module, ModuleCall, Op, Trace  # noqa: E402
from .verbs import draw, load, summary, trace  # noqa: E402

__all__ = [
    "Module", "ModuleCall", "Op", "Trace", "TorchLensError", "TorchLensWarning", "hookimpl",
    "Summary", "compare", "draw", "generate", "load", "record", "steps", "summary",
    "trace",
]
SUBMODULES = ("debug", "types", "viz", "recording", "validation", "plugins", "errors", "edits",
              "sites", "patching", "grads", "attribution", "catalogue")


def __getattr__(name: str):
    """Lazy submodules (``tl.debug``, ``tl.viz``, ...) import on first use; ``tl.generate``
    comes from torchlens-hf."""
    if name == "generate":
        try:
            from torchlens_hf.generation import generate
        except ImportError:
            raise TorchLensError("tl.generate runs a Hugging Face model's generate: it needs "
                                 "torchlens-hf", code="dependency_missing",
                                 teach=["pip install torchlens-hf",
                                        "with tl.steps(model) as run: ...  # any loop"]) from None
        return generate
    if name in SUBMODULES:
        import importlib

        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
