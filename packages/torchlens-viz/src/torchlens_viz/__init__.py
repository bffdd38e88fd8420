"""torchlens-viz: a TorchLens plugin package (entry-point group `torchlens`)."""

__version__ = "0.1.0"
