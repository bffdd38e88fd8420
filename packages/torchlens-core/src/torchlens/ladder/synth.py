"""Seed-0 synthesis from a local generator: the global RNG never advances, the model never moves."""

from __future__ import annotations

import torch
from torch import nn

from .recipes import Recipe

SEED = 0
GENERATOR = "torch.Generator('cpu').manual_seed(0), values drawn on cpu then moved"


def model_device(model: nn.Module) -> torch.device:
    """Where the model lives: its first parameter's or buffer's device (cpu when it has none)."""
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def synthesize(recipes: list[Recipe], device: torch.device) -> list[torch.Tensor]:
    """One tensor per recipe, in order, from one local seed-0 generator."""
    g = torch.Generator(device="cpu").manual_seed(SEED)
    out = []
    for r in recipes:
        if r.dtype == torch.bool:
            t = torch.randint(0, 2, r.shape, generator=g).bool()
        elif r.dtype.is_floating_point:
            t = torch.rand(r.shape, generator=g, dtype=torch.float32)
            t = (t * (r.high - r.low) + r.low).to(r.dtype)
        elif r.dtype.is_complex:
            t = torch.rand(r.shape, generator=g, dtype=r.dtype)
        else:
            t = torch.randint(int(r.low), int(r.high), r.shape, generator=g, dtype=r.dtype)
        out.append(t.to(device))
    return out
