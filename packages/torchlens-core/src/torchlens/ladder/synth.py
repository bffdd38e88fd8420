"""Seed-0 synthesis from a local generator: the global RNG never advances, the model never moves."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import InputError, first_line
from ..units import format_shape
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
    """One tensor per recipe, in order, from one local seed-0 generator.

    Floating values are drawn in float32 and rounded into the recipe's dtype, then kept inside
    ``[low, high)`` (bfloat16 would otherwise round 0.999 up to 1.0). A tensor that cannot be
    allocated refuses ``input_shape_invalid``.
    """
    g = torch.Generator(device="cpu").manual_seed(SEED)
    out = []
    for r in recipes:
        try:
            out.append(_draw(r, g).to(device))
        except (RuntimeError, MemoryError) as exc:
            raise InputError(
                f"cannot make a {format_shape(r.shape)} {str(r.dtype).removeprefix('torch.')} "
                f"input on {device}: {type(exc).__name__}: {first_line(exc, 200)}",
                code="input_shape_invalid",
                teach=["tl.trace(model, input_shape=(1, ...))  # a smaller shape",
                       "tl.trace(model, x)  # or the real input"]) from exc
    return out


def _draw(r: Recipe, g: torch.Generator) -> torch.Tensor:
    if r.dtype == torch.bool:
        return torch.randint(0, 2, r.shape, generator=g).bool()
    if r.dtype.is_complex:
        part = torch.float32 if r.dtype == torch.complex64 else torch.float64
        real, imag = (_uniform(r.shape, part, r.low, r.high, g) for _ in range(2))
        return torch.complex(real, imag)
    if not r.dtype.is_floating_point:
        return torch.randint(int(r.low), int(r.high), r.shape, generator=g, dtype=r.dtype)
    return _uniform(r.shape, r.dtype, r.low, r.high, g)


def _uniform(shape, dtype: torch.dtype, low: float, high: float,
             g: torch.Generator) -> torch.Tensor:
    """Uniform values in ``[low, high)`` of ``dtype``: drawn in float32, scaled in float64."""
    t = torch.rand(shape, generator=g, dtype=torch.float32).double()
    t = (t * (float(high) - float(low)) + float(low)).to(dtype)
    top = torch.tensor(high, dtype=dtype)
    bottom = torch.tensor(low, dtype=dtype)
    if bottom.item() < low:  # the low bound itself rounded down in this dtype
        bottom = torch.nextafter(bottom, top)
    t = torch.where(t >= top, torch.nextafter(top, bottom), t)
    return torch.where(t < bottom, bottom, t)
