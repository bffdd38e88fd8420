"""torchlens-viz: the Graphviz renderer for TorchLens drawings (entry-point group `torchlens`)."""

__version__ = "0.1.0"
