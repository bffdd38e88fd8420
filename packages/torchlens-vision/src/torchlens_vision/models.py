"""Static facts about vision models: HF or not, the first conv, image size and channels."""

from __future__ import annotations

from typing import Any

from torch import nn

SIZES = (224, 32, 256, 299)  # rung-3 image sizes, most common first; bounded on purpose
_NOT_IMAGE_FIRST = (nn.Embedding, nn.EmbeddingBag, nn.RNNBase, nn.Conv1d, nn.Conv3d)


def is_hf_model(model: Any) -> bool:
    """A transformers PreTrainedModel (checked by class names, transformers is not imported)."""
    return any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.")
               for c in type(model).__mro__)


def first_conv(model: nn.Module) -> nn.Conv2d | None:
    """The first registered Conv2d, unless a text/sequence layer comes before it."""
    for module in model.modules():
        if isinstance(module, _NOT_IMAGE_FIRST):
            return None
        if isinstance(module, nn.Conv2d) and module.in_channels > 0:
            return module
    return None


def hf_image_facts(model: Any) -> tuple[int, int, int] | None:
    """(channels, height, width) from an HF pixel-input model's config, else None."""
    if not is_hf_model(model) or getattr(model, "main_input_name", None) != "pixel_values":
        return None
    config = getattr(model, "config", None)
    size = getattr(config, "image_size", None)
    if isinstance(size, (list, tuple)) and len(size) == 2:
        height, width = int(size[0]), int(size[1])
    elif isinstance(size, int) and size > 0:
        height = width = size
    else:
        return None
    channels = getattr(config, "num_channels", None)
    return (int(channels) if isinstance(channels, int) and channels > 0 else 3, height, width)


def is_vision_model(model: Any) -> bool:
    """HF models whose main input is pixel_values, or modules that start with a 2-d conv."""
    if not isinstance(model, nn.Module):
        return False
    if is_hf_model(model):
        return getattr(model, "main_input_name", None) == "pixel_values"
    return first_conv(model) is not None


def input_channels(model: Any) -> int | None:
    """Channels the model takes: HF config.num_channels, else the first conv's in_channels."""
    facts = hf_image_facts(model)
    if facts is not None:
        return facts[0]
    conv = first_conv(model) if isinstance(model, nn.Module) else None
    return conv.in_channels if conv is not None else None


def shape_candidates(model: Any) -> list[Any]:
    """Rung-3 candidates: the HF config's pixel_values shape, else the first conv at SIZES."""
    facts = hf_image_facts(model)
    if facts is not None:
        return [{"pixel_values": (1, *facts)}]
    if not isinstance(model, nn.Module) or is_hf_model(model):
        return []
    conv = first_conv(model)
    return [] if conv is None else [(1, conv.in_channels, s, s) for s in SIZES]


def id2label(model: Any) -> dict[int, str] | None:
    """An HF config's id2label with int keys, when the model has one."""
    mapping = getattr(getattr(model, "config", None), "id2label", None)
    if not mapping:
        return None
    return {int(k): str(v) for k, v in mapping.items()}
