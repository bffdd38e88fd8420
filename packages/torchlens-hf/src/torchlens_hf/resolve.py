"""Real inputs for Hugging Face models: prompt strings, BatchEncodings and modality dicts.

A string is tokenized with the model's own tokenizer; everything the tokenizer did (ids, tokens,
special tokens, padding) is recorded in the facts, so nothing about the input is hidden.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from torchlens.errors import InputError, first_line
from torchlens.plugins import hook
from torchlens.types import ResolvedInput

from .models import forward_params, is_hf_model, modality, vocab_size
from .tokenizer import find_processor, find_tokenizer, processor_facts, tokenizer_facts

PLUGIN = "torchlens-hf"
_PROCESSOR_ARGS = {"text": "text", "image": "images", "images": "images", "audio": "audio",
                   "video": "videos", "videos": "videos"}


def is_text(value: Any) -> bool:
    """A prompt string, or a non-empty list/tuple of them (a batch)."""
    return isinstance(value, str) or (isinstance(value, (list, tuple)) and bool(value)
                                      and all(isinstance(v, str) for v in value))


def is_batch_encoding(value: Any) -> bool:
    """A tokenizer's output (``transformers.BatchEncoding``), without importing transformers."""
    cls = type(value)
    return any(c.__name__ in ("BatchEncoding", "BatchFeature")
               and c.__module__.startswith("transformers.") for c in cls.__mro__)


def is_modality_dict(value: Any) -> bool:
    """``{"text": ..., "image": ...}``: a mapping whose keys are all modality names."""
    return isinstance(value, Mapping) and bool(value) and all(
        isinstance(k, str) and k in _PROCESSOR_ARGS for k in value) and not any(
        isinstance(v, torch.Tensor) for v in value.values())


def resolve_input(model: nn.Module, value: Any, surface: str, options: dict[str, Any]
                  ) -> ResolvedInput | None:
    """The call for one real input, or None when it is not a transformers input for this model."""
    if is_batch_encoding(value):
        return resolve_encoding(model, value)
    if not is_hf_model(model):
        return None
    if modality(model) == "text+vision" and (is_text(value) or is_modality_dict(value)):
        _require_every_modality(model, value, surface)
    if is_text(value):
        return resolve_text(model, value, surface, options)
    if is_modality_dict(value):
        if set(value) == {"text"} and options.get("processor") is None and \
                getattr(model, "processor", None) is None:
            return resolve_text(model, value["text"], surface, options)
        return resolve_modalities(model, value, surface, options)
    return None


def _require_every_modality(model: nn.Module, value: Any, surface: str) -> None:
    """A CLIP-like forward runs both towers: text alone (or an image alone) cannot run it."""
    given = {_PROCESSOR_ARGS[k] for k in value} if isinstance(value, Mapping) else {"text"}
    missing = {"text", "images"} - given
    if missing:
        raise InputError(
            f"{type(model).__name__} runs a text and a vision tower, but the input has no "
            f"{' and no '.join(sorted(missing))}", code="input_modality_missing",
            teach=[f'tl.{surface}(model, {{"text": "a photo of a cat", "image": image}})',
                   f'tl.{surface}(model, processor(text=text, images=image, return_tensors="pt"))'
                   "  # or the tensors yourself"])


def _device_and_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype | None]:
    device, dtype = torch.device("cpu"), None
    for i, t in enumerate(list(model.parameters()) + list(model.buffers())):
        if i == 0:
            device = t.device
        if dtype is None and t.is_floating_point():
            dtype = t.dtype
    return device, dtype


def _bind(model: nn.Module, encoded: Mapping[str, Any]) -> tuple[dict[str, Any], list[str],
                                                                  dict[str, Any]]:
    """Forward kwargs from an encoding: known names kept, tensors moved to the model.

    Returns the kwargs, the names the forward does not take (dropped), and what was moved/cast.
    """
    params = forward_params(model)
    device, dtype = _device_and_dtype(model)
    kwargs, dropped, placed = {}, [], {"device": str(device), "cast": {}}
    for name, v in encoded.items():
        if params and name not in params:
            dropped.append(name)
            continue
        if isinstance(v, torch.Tensor):
            if v.is_floating_point() and dtype is not None and v.dtype != dtype:
                placed["cast"][name] = f"{v.dtype} -> {dtype}".replace("torch.", "")
                v = v.to(dtype)
            v = v.to(device)
        kwargs[name] = v
    return kwargs, dropped, placed


def _check_vocab(model: nn.Module, ids: torch.Tensor, tok: Any) -> None:
    limit = vocab_size(model)
    if limit is None or ids.numel() == 0 or int(ids.max()) < limit:
        return
    raise InputError(
        f"the tokenizer {type(tok).__name__} ({getattr(tok, 'name_or_path', '')!r}) produced id "
        f"{int(ids.max())}, but {type(model).__name__} embeds only {limit} ids: this is not the "
        "model's own tokenizer", code="tokenizer_model_mismatch",
        teach=["tl.trace(model, text, tokenizer=AutoTokenizer.from_pretrained(model.name_or_path))",
               "model.tokenizer = tok  # the tokenizer saved with this model"])


def _decoder_start(model: nn.Module, kwargs: dict[str, Any], batch: int) -> dict | None:
    """Seq2seq models get the first step of generation: ``decoder_start_token_id``, disclosed."""
    config = model.config
    if not getattr(config, "is_encoder_decoder", False) or "decoder_input_ids" in kwargs or \
            "decoder_input_ids" not in forward_params(model):
        return None
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        generation = getattr(model, "generation_config", None)
        start = getattr(generation, "decoder_start_token_id", None)
    if not isinstance(start, int):
        return None
    device = kwargs["input_ids"].device if "input_ids" in kwargs else torch.device("cpu")
    kwargs["decoder_input_ids"] = torch.full((batch, 1), start, dtype=torch.long, device=device)
    return {"ids": [[start]] * batch,
            "source": "config.decoder_start_token_id: the first step of generation"}


def _text_facts(tok: Any, ids: torch.Tensor) -> dict[str, Any]:
    rows = ids.tolist()
    return {"input_ids": rows, "tokens": [tok.convert_ids_to_tokens(r) for r in rows]}


def resolve_text(model: nn.Module, value: str | list[str], surface: str,
                 options: dict[str, Any]) -> ResolvedInput:
    """Tokenize a prompt (or a batch of prompts) with the model's own tokenizer."""
    tok, source = find_tokenizer(model, options, surface)
    batched = not isinstance(value, str)
    texts = list(value) if batched else value
    padding = batched and getattr(tok, "pad_token", None) is not None
    try:
        encoded = tok(texts, return_tensors="pt", padding=padding)
    except ValueError as exc:
        if not batched:
            raise
        raise InputError(
            f"the prompts tokenize to different lengths and {type(tok).__name__} has no pad "
            f"token, so they cannot form one batch ({first_line(exc, 160)})",
            code="tokenizer_padding_unavailable",
            teach=["tok.pad_token = tok.eos_token  # then pass tokenizer=tok",
                   f"tl.{surface}(model, texts[0])  # or one prompt at a time"]) from None
    ids = encoded["input_ids"]
    _check_vocab(model, ids, tok)
    kwargs, dropped, placed = _bind(model, encoded)
    decoder = _decoder_start(model, kwargs, ids.shape[0])
    facts = {
        "plugin": PLUGIN, "kind": "text", "text": texts, "batch_size": int(ids.shape[0]),
        "tokenizer": tokenizer_facts(tok, source, texts[0] if batched else texts),
        "call": {"return_tensors": "pt", "padding": padding, "add_special_tokens": True},
        **_text_facts(tok, ids),
        "attention_mask": encoded["attention_mask"].tolist() if "attention_mask" in encoded
        else None,
        "forward_kwargs": sorted(kwargs), "dropped": dropped, "decoder_input_ids": decoder,
        **placed,
    }
    return ResolvedInput((), kwargs, facts, {"tokenizer": tok})


def resolve_encoding(model: nn.Module, value: Mapping[str, Any]) -> ResolvedInput:
    """A tokenizer/processor output passes as forward keywords; its ids are recorded."""
    encoded = {k: torch.as_tensor(v) if isinstance(v, list) else v for k, v in value.items()}
    encoded = {k: v.unsqueeze(0) if isinstance(v, torch.Tensor) and v.dim() == 1 and
               not v.is_floating_point() else v for k, v in encoded.items()}
    kwargs, dropped, placed = _bind(model, encoded) if is_hf_model(model) else (encoded, [], {})
    ids = kwargs.get("input_ids")
    facts = {
        "plugin": PLUGIN, "kind": type(value).__name__, "keys": sorted(value),
        "converted": sorted(k for k, v in value.items() if isinstance(v, list)),
        "input_ids": ids.tolist() if isinstance(ids, torch.Tensor) else None,
        "forward_kwargs": sorted(kwargs), "dropped": dropped, **placed,
    }
    objects = {}
    if is_hf_model(model) and isinstance(ids, torch.Tensor):
        tok, source = find_tokenizer(model, {}, required=False)
        if tok is not None:
            facts["tokens"] = [tok.convert_ids_to_tokens(r) for r in ids.tolist()]
            facts["tokenizer_found"] = {"class": type(tok).__name__, "source": source}
            objects["tokenizer"] = tok
    return ResolvedInput((), kwargs, facts, objects)


def _image_facts(image: Any) -> dict[str, Any]:
    """Facts from whichever plugin describes images, else the basics we can read."""
    facts = hook().torchlens_describe_input(value=image)
    if facts is not None:
        return facts
    out: dict[str, Any] = {"kind": type(image).__name__}
    if hasattr(image, "size") and not callable(image.size):
        out["size"] = list(image.size)
    if hasattr(image, "mode"):
        out["mode"] = image.mode
    return out


def resolve_modalities(model: nn.Module, value: Mapping[str, Any], surface: str,
                       options: dict[str, Any]) -> ResolvedInput:
    """``{"text": ..., "image": ...}`` through the model's own processor (e.g. CLIPProcessor)."""
    processor, source = find_processor(model, options, surface)
    call = {_PROCESSOR_ARGS[k]: v for k, v in value.items()}
    tok = getattr(processor, "tokenizer", None)
    text = call.get("text")
    extra = {"return_tensors": "pt"}
    if text is not None and not isinstance(text, str) and getattr(tok, "pad_token", None):
        extra["padding"] = True
    encoded = processor(**call, **extra)
    kwargs, dropped, placed = _bind(model, encoded)
    images = call.get("images")
    image_list = images if isinstance(images, (list, tuple)) else ([] if images is None
                                                                   else [images])
    facts: dict[str, Any] = {
        "plugin": PLUGIN, "kind": "modality", "modalities": sorted(value),
        "processor": processor_facts(processor, source),
        "call": {**{k: type(v).__name__ for k, v in call.items()}, **extra},
        "images": [_image_facts(img) for img in image_list],
        "forward_kwargs": sorted(kwargs), "dropped": dropped,
        "shapes": {k: list(v.shape) for k, v in kwargs.items() if isinstance(v, torch.Tensor)},
        **placed,
    }
    if text is not None:
        facts["text"] = text
    ids = kwargs.get("input_ids")
    if isinstance(ids, torch.Tensor) and tok is not None:
        _check_vocab(model, ids, tok)
        sample = text if isinstance(text, str) else (text[0] if text else "")
        facts["tokenizer"] = tokenizer_facts(tok, f"{source} (processor.tokenizer)", sample)
        facts.update(_text_facts(tok, ids))
    return ResolvedInput((), kwargs, facts, {"tokenizer": tok, "processor": processor})
