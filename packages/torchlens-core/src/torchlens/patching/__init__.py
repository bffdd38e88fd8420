"""Activation patching over a grid: ``tl.patching.sweep(model, clean, corrupt, sites=...,
positions=..., metric=fn)`` patches the clean value of each site at each position into the
corrupt run and measures the output, normalised to the two baselines."""

from .grid import PatchingSweep
from .sweep import sweep

__all__ = ["PatchingSweep", "sweep"]
