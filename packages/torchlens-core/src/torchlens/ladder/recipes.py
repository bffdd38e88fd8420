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
from .shapes import Slot, check_bounds, check_spec_bounds, synthesizable
from .signature import ForwardSignature, forward_signature

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
    """A recipe from a spec that names its dtype (bounds already checked), else None."""
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
            f"input_shape{slot.part} (input {slot.name!r}): an integer InputSpec needs high= "
            "(the exclusive upper bound)", code="input_recipe_ambiguous", teach=[SPEC_TEACH])
    return Recipe(slot.spec.shape, dtype, 0 if spec.low is None else spec.low, spec.high, name,
                  source)


def _plugin_recipe_name(r: Recipe) -> str:
    if r.dtype.is_floating_point:
        return "uniform_0_1" if (r.low, r.high) == (0.0, 1.0) else "uniform"
    if r.dtype == torch.bool:
        return "bool"
    if r.high - r.low == 1:
        return {0: "zeros", 1: "ones"}.get(int(r.low), "constant")
    return "vocab_ids"


def _plugin_recipe(model: nn.Module, slot: Slot) -> Recipe | None:
    """Static facts from ``torchlens_input_recipe`` (the first plugin that knows the slot)."""
    facts = [f for f in hook().torchlens_input_recipe(
        model=model, slot={"name": slot.name, "keyword": slot.keyword,
                           "shape": slot.spec.shape}) if f is not None]
    for fact in facts:
        if not isinstance(fact, InputSpec) or (fact.dtype is not None and
                                               not synthesizable(fact.dtype)):
            raise InputError(
                f"a torchlens_input_recipe hook returned {fact!r} for input {slot.name!r}; it "
                "must return an InputSpec with a floating, bool or integer dtype, or None",
                code="plugin_invalid", teach=["pip install -U <the plugin>", SPEC_TEACH])
    facts = [f for f in facts if f.dtype is not None]  # a fact without a dtype fixes nothing
    if not facts:
        return None
    fact = facts[0]
    check_spec_bounds(fact.dtype, fact.low, fact.high, slot.part, code="plugin_invalid")
    spec = InputSpec(slot.spec.shape, fact.dtype, fact.low, fact.high)
    recipe = _from_spec(slot, spec, "plugin", "torchlens_input_recipe hook")
    return Recipe(recipe.shape, recipe.dtype, recipe.low, recipe.high,
                  _plugin_recipe_name(recipe), recipe.source)


def _is_entry(slot: Slot, sig: ForwardSignature) -> bool:
    """Whether the slot is the forward's first input (positional 0 or its first parameter)."""
    if not slot.keyword:
        return slot.name == "0"
    first = sig.positional[:1] or sig.keyword[:1]
    return first == (slot.name,)


def _static_recipe(model: nn.Module, slot: Slot, n_slots: int, sig: ForwardSignature) -> Recipe:
    embeddings = _embeddings(model)
    if not embeddings:
        return Recipe(slot.spec.shape, float_dtype(model), 0.0, 1.0, "uniform_0_1",
                      "the model has no embedding layer: a floating input")
    first = _first_param_leaf(model)
    if n_slots == 1 and _is_entry(slot, sig) and first is not None and isinstance(
            first[1], (nn.Embedding, nn.EmbeddingBag)):
        high = min(m.num_embeddings for _, m in embeddings)
        return Recipe(slot.spec.shape, torch.long, 0, high, "vocab_ids",
                      f"first layer {first[0]!r} is an embedding; ids below {high} fit every "
                      "embedding of the model")
    why = ("it is one of several inputs" if n_slots > 1 else
           "it is not the forward's first input" if not _is_entry(slot, sig) else
           "the first layer is not an embedding")
    raise InputError(
        f"input_shape{slot.part} (input {slot.name!r}): the model has embedding layers "
        f"({', '.join(n for n, _ in embeddings[:3])}) and {why}, so whether this input holds "
        "integer ids or floats is not a static fact",
        code="input_recipe_ambiguous", teach=[SPEC_TEACH, "tl.trace(model, x)  # a real input"])


def recipe_for(model: nn.Module, slot: Slot, n_slots: int,
               sig: ForwardSignature | None = None) -> Recipe:
    """The recipe for one slot, or ``input_recipe_ambiguous`` naming the InputSpec override.

    Order: the caller's InputSpec dtype, then plugin facts, then the model's structure. An
    InputSpec without a dtype keeps the static dtype but its ``low``/``high`` win.
    """
    spec = slot.spec
    recipe = _from_spec(slot, spec, "spec", "caller's InputSpec")
    if recipe is not None:
        return recipe
    base = _plugin_recipe(model, slot) or _static_recipe(
        model, slot, n_slots, sig or forward_signature(model))
    if spec.low is None and spec.high is None:
        return base
    low = base.low if spec.low is None else spec.low
    high = base.high if spec.high is None else spec.high
    check_bounds(base.dtype, low, high, slot.part)
    return Recipe(base.shape, base.dtype, low, high, "spec",
                  f"caller's InputSpec bounds; dtype from: {base.source}")
