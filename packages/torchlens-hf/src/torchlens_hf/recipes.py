"""Static facts from the config for rungs 2 and 3: value recipes, shape candidates, teaches.

Everything here reads ``model.config`` and the forward signature; nothing runs the model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchlens.types import InputSpec

from .models import forward_params, is_hf_model, max_positions, modality, sub_config, vocab_size

SEQ_LEN = 16  # the candidate prompt length, bounded by the position table
_IDS = ("input_ids", "decoder_input_ids")
_MASKS = ("attention_mask", "decoder_attention_mask")
_FLOATS = ("pixel_values", "input_values", "input_features")


def _float_dtype(model: nn.Module) -> torch.dtype:
    for t in model.parameters():
        if t.is_floating_point():
            return t.dtype
    return torch.get_default_dtype()


def _slot_name(model: nn.Module, slot: dict[str, Any]) -> str:
    """A positional slot "0" stands for the model's main input (input_ids for text models)."""
    name = str(slot.get("name", ""))
    if not slot.get("keyword") and name == "0":
        return getattr(model, "main_input_name", "input_ids") or "input_ids"
    return name


def input_recipe(model: nn.Module, slot: dict[str, Any]) -> InputSpec | None:
    """Dtype and value bounds for one forward entry of an HF model, or None when not ours."""
    if not is_hf_model(model):
        return None
    name, shape = _slot_name(model, slot), tuple(slot.get("shape") or ())
    if name in _IDS:
        limit = vocab_size(model)
        return InputSpec(shape, dtype=torch.long, low=0, high=limit) if limit else None
    if name in _MASKS:
        return InputSpec(shape, dtype=torch.long, low=1, high=2)
    if name == "token_type_ids":
        return InputSpec(shape, dtype=torch.long, low=0, high=1)
    if name in _FLOATS:
        return InputSpec(shape, dtype=_float_dtype(model), low=0.0, high=1.0)
    return None


def _seq_len(model: nn.Module, want: int = SEQ_LEN) -> int:
    bound = max_positions(model)
    return max(1, min(want, bound)) if bound else want


def _image_shape(model: nn.Module) -> tuple[int, int, int, int] | None:
    config = sub_config(model, "vision_config")
    size = getattr(config, "image_size", None)
    if isinstance(size, (list, tuple)) and len(size) == 2:
        h, w = size
    elif isinstance(size, dict):
        h, w = size.get("height"), size.get("width")
    else:
        h = w = size
    channels = getattr(config, "num_channels", 3) or 3
    if not (isinstance(h, int) and isinstance(w, int)):
        return None
    return (1, int(channels), h, w)


def _text_slots(model: nn.Module, params: tuple[str, ...], length: int) -> dict[str, tuple]:
    slots: dict[str, tuple] = {"input_ids": (1, length)}
    if "attention_mask" in params:
        slots["attention_mask"] = (1, length)
    if getattr(model.config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        slots["decoder_input_ids"] = (1, length)
    return slots


def shape_candidates(model: nn.Module) -> list[dict[str, tuple]] | None:
    """Mapping-form input_shape candidates from the config, most likely first."""
    if not is_hf_model(model):
        return None
    params, kind = forward_params(model), modality(model)
    image = _image_shape(model)
    found: list[dict[str, tuple]] = []
    if kind == "text+vision" and image is not None:
        for length in dict.fromkeys((_seq_len(model), _seq_len(model, 8))):
            found.append({"input_ids": (1, length), "pixel_values": image,
                          **({"attention_mask": (1, length)} if "attention_mask" in params
                             else {})})
    elif kind == "text":
        for length in dict.fromkeys((_seq_len(model), _seq_len(model, 8))):
            found.append(_text_slots(model, params, length))
    elif kind == "vision" and image is not None:
        found.append({"pixel_values": image})
    return found


def refusal_teach(model: nn.Module) -> list[str] | None:
    """The better next step for an HF model whose shape inference refused: a real input."""
    if not is_hf_model(model):
        return None
    kind = modality(model)
    if kind == "vision":
        return None  # torchlens-vision teaches images for vision-only models
    if kind == "text+vision":
        return ['tl.trace(model, {"text": "a photo of a cat", "image": image})  '
                "# a real prompt and image"]
    return ['tl.trace(model, "The quick brown fox")  # a real prompt string']
