"""Hook implementations of torchlens-hf, registered through the `torchlens` entry point."""

from __future__ import annotations
