"""torchlens-viz: the Graphviz and html renderers for TorchLens drawings.

Registered through the entry-point group `torchlens` (see `plugin.py`).
"""

__version__ = "0.1.0"
