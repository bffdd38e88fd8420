"""Dtype and value recipes for synthesized inputs: static facts only, failing closed.

An unambiguous embedding entry gives integer ids below ``num_embeddings``; an unambiguous float
entry (no embedding, and no parameter table the input could index outside a first layer that
takes only floats, e.g. Linear or Conv) gives uniform [0, 1) floats in its floating dtype;
plugin facts (hook ``torchlens_input_recipe``) come first; anything else refuses
``input_recipe_ambiguous`` before any forward.
"""

from __future__ import annotations

import re
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


# What torch says when a tensor has the wrong dtype for an op (an index that is float, a float
# that should be ids, mismatched operand dtypes).
_DTYPE_ERROR = re.compile(
    r"dtype|scalar type|must be long|indices|index tensor|not implemented for '|Input type \(|"
    r"can't be cast|LongTensor|FloatTensor|IntTensor|integer tensors")


def is_dtype_error(exc: BaseException) -> bool:
    """Whether a forward's error is about a tensor's dtype (the InputSpec override comes first)."""
    return bool(_DTYPE_ERROR.search(str(exc)))


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


# Entry modules whose forward takes only floating input: a first layer of one of these kinds fixes
# a synthesized input's dtype as the model's floating dtype.
FLOAT_ENTRIES = (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd, nn.RNNBase, nn.RNNCellBase,
                 nn.LayerNorm, nn.GroupNorm, nn.RMSNorm, nn.modules.batchnorm._NormBase,
                 nn.MultiheadAttention, nn.PReLU)


def _tables(model: nn.Module, first: tuple[str, nn.Module] | None) -> list[str]:
    """Parameters an input could index (``self.table[x]``: two or more dims, several rows) held
    where no known layer stands between them and the input: by the root forward itself, or by
    a first layer, unless that module is a kind that fixes a dtype (a bare nn.Linear)."""
    owners = [] if isinstance(model, FLOAT_ENTRIES) else [("", model)]
    if first is not None and first[0] and not isinstance(first[1], FLOAT_ENTRIES):
        owners.append(first)
    return [f"{prefix}.{n}" if prefix else n for prefix, m in owners
            for n, p in m.named_parameters(recurse=False) if p.dim() >= 2 and p.shape[0] > 1]


def _float_entry(model: nn.Module, first: tuple[str, nn.Module] | None) -> str | None:
    """Why the input is floating, or None when no entry fixes its dtype."""
    if _tables(model, first):
        return None
    if first is not None and isinstance(first[1], FLOAT_ENTRIES):
        return f"first layer {first[0]!r} ({type(first[1]).__name__}) takes a floating input"
    return "the model holds no embedding and no parameter table an input could index"


def _static_recipe(model: nn.Module, slot: Slot, n_slots: int, sig: ForwardSignature) -> Recipe:
    embeddings = _embeddings(model)
    first = _first_param_leaf(model)
    if not embeddings:
        why = _float_entry(model, first)
        if why is not None:
            return Recipe(slot.spec.shape, float_dtype(model), 0.0, 1.0, "uniform_0_1", why)
        raise InputError(
            f"input_shape{slot.part} (input {slot.name!r}): no entry module fixes its dtype and "
            f"the forward holds parameter table(s) {_tables(model, first)[:3]} it could index, "
            "so whether this input holds floats or integer ids is not a static fact",
            code="input_recipe_ambiguous", teach=[SPEC_TEACH, "tl.trace(model, x)  # a real input"])
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
