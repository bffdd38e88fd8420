"""torchlens-mermaid: an example TorchLens renderer plugin writing Mermaid flowcharts (.mmd)."""

__version__ = "0.1.0"
