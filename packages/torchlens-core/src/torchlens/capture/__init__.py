"""Capture: the recorder (hot path) and the engine that runs one forward and builds the Trace."""

from .engine import capture, capturing

__all__ = ["capture", "capturing"]
