"""An image (or a list, or an HWC uint8 array) becomes the model's call, with provenance facts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from torchlens.errors import InputError
from torchlens.ladder.recipes import float_dtype
from torchlens.ladder.signature import forward_signature
from torchlens.ladder.synth import model_device
from torchlens.types import ResolvedInput

from . import __version__
from .images import ImageBatch, as_image_batch, convert, describe_image
from .models import is_hf_model
from .preprocess import (
    Preprocess,
    apply,
    categories_of,
    expected_channels,
    find_preprocess,
    is_weights_enum,
    teach,
)

PLUGIN = "torchlens-vision"


def resolve_image(model: nn.Module, value: Any, surface: str, options: Mapping[str, Any]
                  ) -> ResolvedInput | None:
    """The call and facts for an image input; None when ``value`` is not an image."""
    batch = as_image_batch(value)
    if batch is None:
        return None
    if is_hf_model(model):
        _check_hf_takes_images(model, surface)
    pre, attempts = find_preprocess(model, options, surface)
    if pre is None:
        raise _unavailable(model, batch, surface, attempts)
    images, records = _converted(pre, model, batch)
    tensors = _placed(apply(pre, images, surface), model)
    args, kwargs = _call(model, tensors)
    facts = _facts(batch, records, pre, args, kwargs)
    objects: dict[str, Any] = {"images": batch.images, "preprocess": pre.fn}
    if pre.categories:
        objects["categories"] = pre.categories
    labels = options.get("labels")
    if labels is not None and is_weights_enum(labels) and categories_of(labels):
        objects["labels"] = categories_of(labels)  # core decodes plain label lists itself
        facts["labels"] = f"{type(labels).__name__}.{labels.name}.meta['categories']"
    return ResolvedInput(args=args, kwargs=kwargs, facts=facts, objects=objects)


def _check_hf_takes_images(model: nn.Module, surface: str) -> None:
    """An image alone suits HF models whose main input is pixel_values; refuse the others."""
    main = getattr(model, "main_input_name", None)
    if main == "pixel_values":
        return
    name = type(model).__name__
    if "pixel_values" in forward_signature(model).keyword:
        raise InputError(
            f"{name} takes {main} as well as pixel_values: an image alone cannot run it",
            code="input_modality_missing",
            teach=[f'tl.{surface}(model, {{"text": "a photo of a cat", "image": image}})',
                   f'tl.{surface}(model, processor(text=text, images=image, return_tensors="pt"))'
                   "  # or the tensors yourself"])
    raise InputError(f"{name} takes {main}, not images", code="input_unresolved",
                     teach=[f"tl.{surface}(model, x)  # x: what {name}.forward takes ({main})"])


def _unavailable(model: nn.Module, batch: ImageBatch, surface: str, attempts: list[str]
                 ) -> InputError:
    what = "a list of images" if batch.batched else "an image"
    tried = "; ".join(attempts)
    return InputError(
        f"tl.{surface} got {what} for {type(model).__name__}, but no image preprocessing is "
        "known for it (no preprocess=/processor=, no model.preprocess / model.transforms / "
        f"model.image_processor, no registered one{'; ' + tried if tried else ''}). TorchLens "
        "never applies a default normalization", code="preprocess_unavailable",
        teach=teach(model, surface))


def _converted(pre: Preprocess, model: nn.Module, batch: ImageBatch):
    """Each image in the mode the preprocessing expects, with the conversion records."""
    channels, because = expected_channels(pre, model)
    style = "torchvision"
    if pre.hf:
        style = "processor" if getattr(pre.fn, "do_convert_rgb", None) else "hf"
    images, records = [], []
    for image in batch.images:
        converted, record = convert(image, channels, style)
        if record is not None:
            record["because"] = because
        images.append(converted)
        records.append(record)
    return images, records


def _placed(tensors: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """Tensors on the model's device; floating ones in the model's floating dtype."""
    device, dtype = model_device(model), float_dtype(model)
    return {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
            for k, v in tensors.items()}


def _call(model: nn.Module, tensors: dict[str, torch.Tensor]) -> tuple[tuple, dict]:
    """HF models take the processor's tensors by name; other models take pixel_values first."""
    if is_hf_model(model):
        sig = forward_signature(model)
        return (), {k: v for k, v in tensors.items()
                    if k == "pixel_values" or sig.var_keyword or k in sig.keyword}
    return (tensors["pixel_values"],), {}


def _facts(batch: ImageBatch, records: list, pre: Preprocess, args: tuple, kwargs: dict
           ) -> dict[str, Any]:
    images = []
    for i, (image, record) in enumerate(zip(batch.images, records)):
        row = describe_image(image)
        if batch.arrays is not None:
            row.update(kind="numpy.ndarray", array=batch.arrays[i])
        row["conversion"] = record
        images.append(row)
    return {
        "plugin": PLUGIN,
        "plugin_version": __version__,
        "input": "image batch" if batch.batched else "image",
        "source": batch.source,
        "batch_size": len(images),
        "images": images,
        "preprocess": pre.describe(),
        "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype).removeprefix("torch."),
                        "device": str(v.device)}
                    for k, v in [*((str(i), a) for i, a in enumerate(args)), *kwargs.items()]},
    }
