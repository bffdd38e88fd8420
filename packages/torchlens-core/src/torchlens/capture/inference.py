"""Surfaces under ``torch.inference_mode``: they run as under ``torch.no_grad`` instead.

Inference tensors keep no version counter, and TorchLens follows in-place writes by version
counters, so a surface called inside ``inference_mode`` leaves it for its own length (what it
computes is the same; no autograd graph is recorded either way), and an input tensor made in
inference mode is used through an ordinary copy. A model whose parameters were made in
inference mode is refused before any forward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.nn.parameter import is_lazy
from torch.utils._pytree import tree_map_only

from ..errors import InputError

F = TypeVar("F", bound=Callable[..., Any])


def outside_inference_mode(surface: F) -> F:
    """Run ``surface`` outside ``torch.inference_mode`` (as ``torch.no_grad``) when it is on."""

    @functools.wraps(surface)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_inference_mode_enabled():
            return surface(*args, **kwargs)
        with torch.inference_mode(False), torch.no_grad():
            return surface(*args, **kwargs)

    return run  # type: ignore[return-value]


def ordinary(value: Any) -> Any:
    """``value`` with each tensor made in inference mode replaced by an ordinary copy."""
    return tree_map_only(torch.Tensor, lambda t: t.clone() if t.is_inference() else t, value)


def refuse_inference_parameters(model: torch.nn.Module, params: list, surface: str) -> None:
    """A model built in inference mode has parameters no surface can follow writes to."""
    made = [name for name, p in params[:1] + params[-1:] if not is_lazy(p) and p.is_inference()]
    if made:
        raise InputError(
            f"{type(model).__name__}'s parameters ({made[0]}) were made inside "
            "torch.inference_mode, so they keep no version counter to follow writes by",
            code="inference_parameters",
            teach=["build or load the model outside torch.inference_mode, then "
                   f"tl.{surface}(model, x)",
                   "model.load_state_dict(state)  # into a model built outside it"])
