"""Hook implementations of torchlens-vision, registered through the `torchlens` entry point."""

from __future__ import annotations

from typing import Any

from torchlens import hookimpl

from . import anatomy, decode, images, models, resolve


@hookimpl
def torchlens_resolve_input(model, value, surface, options):
    """A real PIL image, a list of them or an HWC uint8 array, through the model's preprocessing."""
    return resolve.resolve_image(model, value, surface, options or {})


@hookimpl
def torchlens_describe_input(value):
    """Size, mode and content hash of a PIL image (the HF plugin asks for modality dicts)."""
    return images.describe_value(value)


@hookimpl
def torchlens_shape_candidates(model) -> list[Any]:
    """An HF config's pixel_values shape, or the first conv's channels at common sizes."""
    return models.shape_candidates(model)


@hookimpl
def torchlens_refusal_teach(model) -> list[str]:
    """For vision models, a real image is the better answer than a guessed shape."""
    if not models.is_vision_model(model):
        return []
    how = ('processor=AutoImageProcessor.from_pretrained("<model id>")'
           if models.is_hf_model(model) else "preprocess=weights.transforms()")
    return [f'tl.trace(model, PIL.Image.open("photo.jpg"), {how})  # a real image (best)']


@hookimpl
def torchlens_decode_output(trace, k):
    """Class labels for image classifiers (config.id2label or the weights' categories)."""
    return decode.decode(trace, k)


@hookimpl
def torchlens_transformer_hints(model) -> dict[str, Any] | None:
    """Head counts and the patch embedding, position parameter and head of a timm ViT."""
    return anatomy.hints(model)
