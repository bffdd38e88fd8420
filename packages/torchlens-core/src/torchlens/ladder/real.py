"""Rung 1: the caller's real input becomes call args/kwargs; plugins resolve strings and images."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from ..plugins import hook
from ..types import ResolvedInput

_MODALITY_KEYS = {"text", "image", "images", "audio", "video"}


def _kind_needing_plugin(value: Any) -> str | None:
    """'text', 'image' or 'modality dict' for inputs only a plugin can turn into tensors."""
    if isinstance(value, (str, bytes)):
        return "text"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return "text"
    module = type(value).__module__ or ""
    if module.startswith("PIL.") or module.startswith("numpy"):
        return "image"
    if isinstance(value, (list, tuple)) and value and all(
        (type(v).__module__ or "").startswith("PIL.") for v in value
    ):
        return "image"
    if isinstance(value, Mapping) and value and set(map(str, value)) <= _MODALITY_KEYS and not \
            any(isinstance(v, torch.Tensor) for v in value.values()):
        return "modality dict"
    return None


def unresolved_teach(kind: str, surface: str) -> list[str]:
    verb = f"tl.{surface}"
    if kind == "image":
        return [
            "pip install torchlens-vision  # a PIL image is a real input for vision models",
            f"{verb}(model, image, preprocess=weights.transforms())  # pass the model's transform",
            f"{verb}(model, preprocess(image).unsqueeze(0))  # or pass the tensor yourself",
        ]
    return [
        "pip install torchlens-hf  # a string is a real input for Hugging Face models",
        f"{verb}(model, text, tokenizer=tokenizer)  # or attach it: model.tokenizer = tokenizer",
        f'{verb}(model, tokenizer(text, return_tensors="pt"))  # or pass the tensors yourself',
    ]


def resolve_real(model: nn.Module, value: Any, input_kwargs: dict | None, surface: str,
                 options: dict[str, Any]) -> ResolvedInput:
    """Turn a real input into the call: tensors as given, other kinds through plugins."""
    kwargs = dict(input_kwargs or {})
    if isinstance(value, torch.Tensor):
        return ResolvedInput((value,), kwargs)
    resolved = hook().torchlens_resolve_input(model=model, value=value, surface=surface,
                                              options=options)
    if resolved is not None:
        resolved.kwargs = {**resolved.kwargs, **kwargs}
        return resolved
    kind = _kind_needing_plugin(value)
    if kind is not None:
        raise InputError(
            f"tl.{surface} got a {kind} ({type(value).__name__}) as the real input of "
            f"{type(model).__name__}, and no installed plugin resolves it for this model",
            code="input_unresolved", teach=unresolved_teach(kind, surface))
    if isinstance(value, Mapping):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise InputError(
                f"a mapping input binds forward keyword names, but it has keys {bad[:3]!r}",
                code="input_unresolved",
                teach=[f"tl.{surface}(model, {{'x': tensor}})", f"tl.{surface}(model, (a, b))"])
        return ResolvedInput((), {**value, **kwargs})
    if isinstance(value, (tuple, list)):
        return ResolvedInput(tuple(value), kwargs)
    return ResolvedInput((value,), kwargs)


def describe_value(value: Any) -> dict[str, Any]:
    """JSON-safe facts about one caller-given value for the provenance record."""
    if isinstance(value, torch.Tensor):
        return {"kind": "tensor", "shape": list(value.shape),
                "dtype": str(value.dtype).removeprefix("torch."), "device": str(value.device),
                "recipe": "caller"}
    return {"kind": type(value).__name__, "recipe": "caller", "repr": repr(value)[:120]}
