"""Image values: which inputs are images, their provenance facts, and their mode conversion."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from PIL import Image

_MODE_FOR_CHANNELS = {1: "L", 3: "RGB", 4: "RGBA"}


@dataclass
class ImageBatch:
    """The caller's image(s) as PIL images, where they came from, and whether it was a list."""

    images: list[Image.Image]
    source: str  # "PIL" | "numpy"
    batched: bool
    arrays: list[dict[str, Any]] | None = None  # shape/dtype of numpy inputs


def _is_hwc_uint8(value: Any) -> bool:
    """A numpy HWC uint8 array with 1, 3 or 4 channels (checked without importing numpy)."""
    if not (type(value).__module__ or "").startswith("numpy"):
        return False
    shape = getattr(value, "shape", None)
    return (str(getattr(value, "dtype", "")) == "uint8" and shape is not None and len(shape) == 3
            and shape[0] > 0 and shape[1] > 0 and shape[2] in (1, 3, 4))


def _from_array(array: Any) -> Image.Image:
    import numpy as np

    array = np.ascontiguousarray(array)
    return Image.fromarray(array[..., 0] if array.shape[2] == 1 else array)


def as_image_batch(value: Any) -> ImageBatch | None:
    """The value as an ImageBatch when it is a real PIL image, an HWC uint8 array or a list."""
    items, batched = ([value], False) if not isinstance(value, (list, tuple)) else (value, True)
    if not items:
        return None
    if all(isinstance(v, Image.Image) for v in items):
        return ImageBatch(list(items), "PIL", batched)
    if all(_is_hwc_uint8(v) for v in items):
        arrays = [{"shape": list(v.shape), "dtype": str(v.dtype), "layout": "HWC"} for v in items]
        return ImageBatch([_from_array(v) for v in items], "numpy", batched, arrays)
    return None


def content_hash(image: Image.Image) -> str:
    """sha256 over the mode, size, pixel bytes and (palette images) the palette."""
    h = hashlib.sha256(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
    h.update(image.tobytes())
    if image.mode in ("P", "PA"):
        h.update(bytes(image.getpalette() or []))
    return h.hexdigest()


def describe_image(image: Image.Image) -> dict[str, Any]:
    """JSON-safe facts for one PIL image: size (width, height), mode and content hash."""
    return {"kind": "PIL.Image", "size": list(image.size), "mode": image.mode,
            "sha256": content_hash(image), "sha256_of": "mode, size, pixel bytes, palette"}


def describe_value(value: Any) -> dict[str, Any] | None:
    """Facts for a PIL image or an HWC uint8 array; None for anything else."""
    if isinstance(value, Image.Image):
        return describe_image(value)
    if _is_hwc_uint8(value):
        facts = describe_image(_from_array(value))
        return {**facts, "kind": "numpy.ndarray", "shape": list(value.shape), "dtype": "uint8"}
    return None


def _has_alpha(image: Image.Image) -> bool:
    return "A" in image.getbands() or image.info.get("transparency") is not None


def convert(image: Image.Image, channels: int | None, style: str
            ) -> tuple[Image.Image, dict[str, Any] | None]:
    """Convert to the mode ``channels`` needs; returns the image and the conversion record.

    ``style`` is "torchvision" (``image.convert("RGB")``, as torchvision's ``pil_loader`` does),
    "hf" (transparency composited on white, as transformers' ``convert_to_rgb`` does) or
    "processor" (the HF processor converts itself: recorded, left to it).
    """
    target = _MODE_FOR_CHANNELS.get(channels or 0)
    if target is None or image.mode == target:
        return image, None
    record: dict[str, Any] = {"from": image.mode, "to": target}
    if style == "processor" and target == "RGB":
        record["method"] = "by the image processor (do_convert_rgb=True)"
        return image, record
    if target == "RGB" and style == "hf" and _has_alpha(image):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        record["method"] = 'Image.alpha_composite(white, image.convert("RGBA")).convert("RGB")'
        return Image.alpha_composite(white, rgba).convert("RGB"), record
    if image.mode == "P" and image.info.get("transparency") is not None:
        record["method"] = f'image.convert("RGBA").convert("{target}")'
        return image.convert("RGBA").convert(target), record
    record["method"] = f'image.convert("{target}")'
    return image.convert(target), record
