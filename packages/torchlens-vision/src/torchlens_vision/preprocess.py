"""Finding the model's own image preprocessing and applying it; never a default normalization."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from torch import nn

from torchlens.errors import InputError
from torchlens.plugins import hook

from .describe import describe_processor, describe_transform
from .models import input_channels, is_hf_model

_HF_PROCESSOR_BASES = {"BaseImageProcessor", "BaseImageProcessorFast", "ImageProcessingMixin"}


@dataclass
class Preprocess:
    """One preprocessing step found for the model, with where it came from."""

    fn: Any  # a transform (called per image) or an HF image processor (called on the batch)
    via: str  # "preprocess=", "processor=", "model.preprocess", ... (for the record and errors)
    hf: bool
    weights: str | None = None  # "ResNet18_Weights.IMAGENET1K_V1" when given a weights enum
    loaded_from: str | None = None  # the folder AutoImageProcessor read
    categories: list[str] | None = None

    def describe(self) -> dict[str, Any]:
        """The preprocessing as plain data, for the trace's provenance."""
        facts = describe_processor(self.fn) if self.hf else describe_transform(self.fn)
        facts = {"via": self.via, "kind": "hf_image_processor" if self.hf else "transform",
                 **facts}
        if self.weights:
            facts["weights"] = self.weights
        if self.loaded_from:
            facts["loaded_from"] = self.loaded_from
        return facts


def is_weights_enum(obj: Any) -> bool:
    """A torchvision weights enum member (e.g. ``ResNet18_Weights.IMAGENET1K_V1``)."""
    return any(c.__name__ == "WeightsEnum" and c.__module__.startswith("torchvision.")
               for c in type(obj).__mro__)


def weights_name(obj: Any) -> str:
    """A torchvision weights enum's name, such as ``ResNet18_Weights.IMAGENET1K_V1``."""
    return f"{type(obj).__name__}.{obj.name}"


def categories_of(obj: Any) -> list[str] | None:
    """The class names a weights enum's metadata lists, or None."""
    cats = getattr(obj, "meta", {}).get("categories")
    return list(cats) if cats else None


def is_hf_processor(obj: Any) -> bool:
    """Whether ``obj`` is a Hugging Face image processor, judged by its classes (without
    importing transformers)."""
    return any(c.__name__ in _HF_PROCESSOR_BASES and c.__module__.startswith("transformers.")
               for c in type(obj).__mro__)


def _as_preprocess(obj: Any, via: str) -> Preprocess | None:
    """A Preprocess from a transform, an HF (image) processor or a weights enum; else None."""
    if obj is None:
        return None
    if is_weights_enum(obj):
        return Preprocess(obj.transforms(), via, False, weights=weights_name(obj),
                          categories=categories_of(obj))
    inner = getattr(obj, "image_processor", None)
    if inner is not None and is_hf_processor(inner):
        return Preprocess(inner, f"{via}.image_processor", True)
    if is_hf_processor(obj):
        return Preprocess(obj, via, True)
    if callable(obj) and not (isinstance(obj, nn.Module) and any(True for _ in obj.parameters())):
        return Preprocess(obj, via, False)
    return None


def _auto_processor(model: nn.Module) -> tuple[Preprocess | None, str]:
    """AutoImageProcessor from the model's name_or_path, offline; (None, why) when none."""
    path = getattr(model, "name_or_path", None) or getattr(
        getattr(model, "config", None), "_name_or_path", None)
    if not path:
        return None, "AutoImageProcessor: the model has no name_or_path"
    try:
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # absent files, no network: a refusal below, never a guess
        first = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        return None, f"AutoImageProcessor.from_pretrained({path!r}, local_files_only=True): {first}"
    found = _as_preprocess(processor, "AutoImageProcessor.from_pretrained(name_or_path)")
    if found is None:
        return None, f"AutoImageProcessor found a {type(processor).__name__} for {path!r}"
    found.loaded_from = str(path)
    return found, ""


def find_preprocess(model: nn.Module, options: Mapping[str, Any], surface: str
                    ) -> tuple[Preprocess | None, list[str]]:
    """The caller's, then the attached, then a plugin-registered, then the HF saved processor.

    Returns the preprocessing found (or None) and why the HF lookup found none, for the refusal.
    """
    for via, obj in (("preprocess=", options.get("preprocess")),
                     ("processor=", options.get("processor"))):
        if obj is not None:
            found = _as_preprocess(obj, via)
            if found is None:
                raise InputError(
                    f"{via} is a {type(obj).__name__}, which is neither a transform nor an image "
                    "processor", code="preprocess_unavailable", teach=teach(model, surface))
            return found, []
    for attr in ("preprocess", "transforms", "image_processor"):
        found = _as_preprocess(getattr(model, attr, None), f"model.{attr}")
        if found is not None:
            return found, []
    registered = hook().torchlens_image_preprocess(model=model)
    found = _as_preprocess(registered, "torchlens_image_preprocess hook")
    if found is not None:
        return found, []
    if not is_hf_model(model):
        return None, []
    found, why = _auto_processor(model)
    return (found, []) if found is not None else (None, [why])


def teach(model: nn.Module, surface: str) -> list[str]:
    """The ways to provide preprocessing, best first for this kind of model."""
    verb = f"tl.{surface}"
    torchvision_way = [
        f"{verb}(model, image, preprocess=weights.transforms())  "
        "# e.g. ResNet18_Weights.DEFAULT.transforms()",
        "model.preprocess = weights.transforms()  # or attach the transform to the model once",
    ]
    hf_way = [f'{verb}(model, image, processor=AutoImageProcessor.from_pretrained("<model id>"))',
              "processor.save_pretrained(model.name_or_path)  # so it is found offline next time"]
    rest = [f"{verb}(model, preprocess(image).unsqueeze(0))  # or pass the tensor yourself",
            "@torchlens.hookimpl def torchlens_image_preprocess(model): ...  "
            "# or register one for the model class in a plugin"]
    return (hf_way + torchvision_way[:1] if is_hf_model(model) else torchvision_way) + rest


def expected_channels(pre: Preprocess, model: nn.Module) -> tuple[int | None, str]:
    """How many channels the preprocessing wants, and the fact that says so."""
    if pre.hf:
        if getattr(pre.fn, "do_convert_rgb", None):
            return 3, "the image processor says do_convert_rgb=True"
        mean = getattr(pre.fn, "image_mean", None)
        if getattr(pre.fn, "do_normalize", True) and isinstance(mean, (list, tuple)):
            return len(mean), f"the image processor normalizes {len(mean)} channels (image_mean)"
    else:
        mean = _transform_mean(pre.fn)
        if mean is not None:
            return len(mean), f"the transform normalizes {len(mean)} channels (mean={mean})"
    channels = input_channels(model)
    if channels is not None:
        return channels, f"the model's first layer takes {channels} channels"
    return None, "nothing states the channel count; the image is passed as it is"


def _transform_mean(fn: Any, depth: int = 0) -> list[float] | None:
    mean = getattr(fn, "mean", None)
    if isinstance(mean, (list, tuple)) and mean and all(isinstance(m, (int, float))
                                                        for m in mean):
        return [float(m) for m in mean]
    if isinstance(mean, torch.Tensor) and mean.dim() == 1:
        return [float(m) for m in mean.tolist()]
    steps = getattr(fn, "transforms", None)
    if depth < 4 and isinstance(steps, (list, tuple)):
        for step in steps:
            found = _transform_mean(step, depth + 1)
            if found is not None:
                return found
    return None


def apply(pre: Preprocess, images: list[Image.Image], surface: str = "trace"
          ) -> dict[str, torch.Tensor]:
    """Run the preprocessing; an HF processor's tensors by name, a transform's as pixel_values."""
    try:
        if pre.hf:
            out = pre.fn(images=images, return_tensors="pt")
            tensors = {k: v for k, v in dict(out).items() if isinstance(v, torch.Tensor)}
        else:
            tensors = {"pixel_values": _stack([pre.fn(img) for img in images], surface)}
    except InputError:
        raise
    except Exception as exc:
        raise InputError(
            f"the image preprocessing from {pre.via} ({type(pre.fn).__name__}) failed: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
            code="preprocess_failed",
            teach=["check the transform on the image by hand: preprocess(image)",
                   f"tl.{surface}(model, preprocess(image).unsqueeze(0))  # or pass the tensor"],
        ) from exc
    if "pixel_values" not in tensors:
        raise InputError(
            f"the image processor from {pre.via} returned no pixel_values (got {sorted(tensors)})",
            code="preprocess_failed",
            teach=[f"tl.{surface}(model, processor(images=image, return_tensors='pt'))"])
    return tensors


def _stack(outputs: list[Any], surface: str) -> torch.Tensor:
    """Per-image transform outputs (CHW, or 1xCxHxW) as one NCHW batch."""
    bad = [type(o).__name__ for o in outputs if not isinstance(o, torch.Tensor)
           or o.dim() not in (3, 4) or (o.dim() == 4 and o.shape[0] != 1)]
    if bad:
        got = bad[0] if bad[0] != "Tensor" else "a tensor of the wrong rank"
        raise InputError(
            f"the transform returned {got}, not a CxHxW tensor per image",
            code="preprocess_failed",
            teach=["end the transform with ToTensor() or PILToTensor() + ConvertImageDtype",
                   f"tl.{surface}(model, tensor)  # or pass the tensor yourself"])
    return torch.stack([o[0] if o.dim() == 4 else o for o in outputs])
