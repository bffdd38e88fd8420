"""Dtype and value recipes for synthesized inputs: static facts only, failing closed.

An unambiguous embedding entry gives integer ids below ``num_embeddings``; a model with no
embedding at all gives uniform [0, 1) floats in its floating dtype; plugin facts (hook
``torchlens_input_recipe``) come first; anything else refuses ``input_recipe_ambiguous``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from ..plugins import hook
from ..types import InputSpec
from .shapes import Slot

SPEC_TEACH = ("torchlens.types.InputSpec(shape, dtype=..., low=..., high=...)  e.g. "
              "input_shape={name: InputSpec((1, 16), dtype=torch.long, low=0, high=1000)}")


@dataclass(frozen=True)
class Recipe:
    """How one slot's values are made: dtype, bounds, recipe name and the fact behind it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    low: float | int
    high: float | int
    name: str  # uniform_0_1 | vocab_ids | spec | plugin | ones | zeros
    source: str

    def describe(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": str(self.dtype).removeprefix("torch."),
                "recipe": self.name, "low": self.low, "high": self.high, "source": self.source}


def float_dtype(model: nn.Module) -> torch.dtype:
    """The model's floating dtype (its first floating parameter or buffer), else the default."""
    for t in list(model.parameters()) + list(model.buffers()):
        if t.is_floating_point() and not isinstance(t, nn.parameter.UninitializedTensorMixin):
            return t.dtype
    return torch.get_default_dtype()


def _embeddings(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Embedding,
                                                                          nn.EmbeddingBag))]


def _first_param_leaf(model: nn.Module) -> tuple[str, nn.Module] | None:
    for name, module in model.named_modules():
        if next(module.children(), None) is None and next(module.parameters(False), None) \
                is not None:
            return name, module
    return None


def _from_spec(slot: Slot, spec: InputSpec, name: str, source: str) -> Recipe | None:
    dtype = spec.dtype
    if dtype is None:
        return None
    if dtype == torch.bool:
        return Recipe(slot.spec.shape, dtype, 0, 2, name, source)
    if dtype.is_floating_point or dtype.is_complex:
        low = 0.0 if spec.low is None else spec.low
        high = 1.0 if spec.high is None else spec.high
        return Recipe(slot.spec.shape, dtype, low, high, name, source)
    if spec.high is None:
        raise InputError(
            f"input {slot.name!r}: an integer InputSpec needs high= (the exclusive upper bound)",
            code="input_recipe_ambiguous", teach=[SPEC_TEACH])
    return Recipe(slot.spec.shape, dtype, 0 if spec.low is None else spec.low, spec.high, name,
                  source)


def _plugin_recipe_name(r: Recipe) -> str:
    if r.dtype.is_floating_point:
        return "uniform_0_1" if (r.low, r.high) == (0.0, 1.0) else "uniform"
    if r.high - r.low == 1:
        return {0: "zeros", 1: "ones"}.get(int(r.low), "constant")
    return "vocab_ids"


def recipe_for(model: nn.Module, slot: Slot, n_slots: int) -> Recipe:
    """The recipe for one slot, or ``input_recipe_ambiguous`` naming the InputSpec override."""
    recipe = _from_spec(slot, slot.spec, "spec", "caller's InputSpec")
    if recipe is not None:
        return recipe
    facts = [f for f in hook().torchlens_input_recipe(
        model=model, slot={"name": slot.name, "keyword": slot.keyword,
                           "shape": slot.spec.shape}) if f is not None]
    if facts:
        spec = facts[0]
        spec = InputSpec(slot.spec.shape, spec.dtype, spec.low, spec.high)
        recipe = _from_spec(slot, spec, "plugin", "torchlens_input_recipe hook")
        if recipe is not None:
            return Recipe(recipe.shape, recipe.dtype, recipe.low, recipe.high,
                          _plugin_recipe_name(recipe), recipe.source)
    embeddings = _embeddings(model)
    if not embeddings:
        return Recipe(slot.spec.shape, float_dtype(model), 0.0, 1.0, "uniform_0_1",
                      "the model has no embedding layer: a floating input")
    first = _first_param_leaf(model)
    if n_slots == 1 and first is not None and isinstance(first[1], (nn.Embedding,
                                                                     nn.EmbeddingBag)):
        high = min(m.num_embeddings for _, m in embeddings)
        return Recipe(slot.spec.shape, torch.long, 0, high, "vocab_ids",
                      f"first layer {first[0]!r} is an embedding; ids below {high} fit every "
                      "embedding of the model")
    raise InputError(
        f"input {slot.name!r}: the model has embedding layers "
        f"({', '.join(n for n, _ in embeddings[:3])}) but its entry is not unambiguously an "
        "embedding, so the dtype of this input is not a static fact",
        code="input_recipe_ambiguous", teach=[SPEC_TEACH, "tl.trace(model, x)  # a real input"])
