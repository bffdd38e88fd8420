"""Hook implementations of torchlens-viz, registered through the `torchlens` entry point."""

from __future__ import annotations
