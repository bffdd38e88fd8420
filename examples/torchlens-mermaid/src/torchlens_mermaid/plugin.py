"""The hook implementation TorchLens finds through the `torchlens` entry point."""

from __future__ import annotations

from torchlens import hookimpl


@hookimpl
def torchlens_renderers():
    """Register the Mermaid renderer under the name "mermaid"."""
    from .renderer import MermaidRenderer

    return {"mermaid": MermaidRenderer}
