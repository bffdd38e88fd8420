"""Default backward targets."""

from __future__ import annotations

from typing import Any

from torch import Tensor


def summed_output(output: Any) -> Tensor:
    """The first floating-point tensor of a model's output (logits, last hidden state, the
    output itself), summed."""
    from ..capture.boundaries import leaves

    for t in leaves(output, []):
        if t.is_floating_point() and t.requires_grad:
            return t.sum()
    from .backward import GradError

    raise GradError("the output holds no floating-point tensor that needs a gradient",
                    code="grads_target_invalid",
                    teach=["tl.summary(model, x, grads=lambda out: ...)  # a scalar target"])
