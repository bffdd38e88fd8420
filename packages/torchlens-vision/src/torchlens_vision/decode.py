"""Class labels for image classifiers: HF config.id2label or torchvision weights' categories."""

from __future__ import annotations

from typing import Any

from torchlens.semantics import main_output, top_k
from torchlens.types import DecodedOutput

from .models import id2label, is_hf_model, is_vision_model

PLUGIN = "torchlens-vision"


def _labels(model: Any, objects: dict[str, Any]) -> tuple[Any, str]:
    categories = objects.get("categories")
    if categories:
        return categories, "torchvision weights meta['categories']"
    if model is not None and is_hf_model(model):
        mapping = id2label(model)
        if mapping:
            return mapping, "config.id2label"
    return None, ""


def decode(trace: Any, k: int) -> DecodedOutput | None:
    """Top-k labels per image for a vision trace whose output is (batch, classes) logits."""
    objects = getattr(trace, "_objects", {}) or {}
    model = objects.get("model")
    resolver = (getattr(trace, "provenance", None) or {}).get("resolver") or {}
    if resolver.get("plugin") != PLUGIN and not (model is not None and is_vision_model(model)):
        return None
    labels, source = _labels(model, objects)
    logits = main_output(trace) if labels is not None else None
    if logits is None or logits.dim() != 2 or logits.shape[-1] != len(labels):
        return None
    rows: list[dict[str, Any]] = []
    best = []
    for item in range(logits.shape[0]):
        item_rows = [{"item": item, **row} for row in top_k(logits[item], k, labels)]
        rows.extend(item_rows)
        if item_rows:
            top = item_rows[0]
            best.append(f"{top['label'] if top['label'] is not None else top['index']} "
                        f"(p={top['prob']:.3f})")
    text = best[0] if len(best) == 1 else "; ".join(f"[{i}] {b}" for i, b in enumerate(best))
    return DecodedOutput(text, rows, source)
