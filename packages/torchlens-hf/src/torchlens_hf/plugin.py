"""Hook implementations of torchlens-hf, registered through the `torchlens` entry point.

Each hook delegates to the module that owns its concern; all return None for non-HF models.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from torchlens import hookimpl
from torchlens.types import DecodedOutput, InputSpec, ResolvedInput

from . import anatomy, decode, generation, models, recipes, resolve


@hookimpl
def torchlens_resolve_input(model: nn.Module, value: Any, surface: str,
                            options: dict[str, Any]) -> ResolvedInput | None:
    """A prompt string, a batch of them, a BatchEncoding or a modality dict for an HF model."""
    return resolve.resolve_input(model, value, surface, options or {})


@hookimpl
def torchlens_input_recipe(model: nn.Module, slot: dict[str, Any]) -> InputSpec | None:
    """Ids below the vocab, masks of ones, token types of zeros, pixels in the model's dtype."""
    return recipes.input_recipe(model, slot)


@hookimpl
def torchlens_shape_candidates(model: nn.Module) -> list[dict[str, tuple]] | None:
    """Mapping-form shapes from the config (sequence length, image size, decoder inputs)."""
    return recipes.shape_candidates(model)


@hookimpl
def torchlens_refusal_teach(model: nn.Module) -> list[str] | None:
    """For HF models, a real prompt string first."""
    return recipes.refusal_teach(model)


@hookimpl
def torchlens_tied_parameters(model: nn.Module) -> dict[str, str] | None:
    """The weights a transformers model ties, as its config says."""
    return models.tied_parameters(model)


@hookimpl
def torchlens_decode_output(trace, k: int) -> DecodedOutput | None:
    """Next token, labels or mask fills for a gold trace of an HF model."""
    return decode.decode_output(trace, k)


@hookimpl
def torchlens_generate():
    """``tl.generate``: a Hugging Face model's ``generate`` run as one step capture."""
    return generation.generate


@hookimpl
def torchlens_load_model(path: str, meta: bool) -> nn.Module | None:
    """A local Hugging Face model folder (or its ``config.json``) for the command line, offline;
    with ``meta`` built from the config on the meta device."""
    return models.load_folder(path, meta=meta)


@hookimpl
def torchlens_transformer_hints(model: nn.Module) -> dict[str, Any] | None:
    """Head counts, parallel residual, rotary positions and the (un)embedding modules from a
    transformers model's config."""
    return anatomy.hints(model)
