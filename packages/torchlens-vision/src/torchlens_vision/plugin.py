"""Hook implementations of torchlens-vision, registered through the `torchlens` entry point."""

from __future__ import annotations
