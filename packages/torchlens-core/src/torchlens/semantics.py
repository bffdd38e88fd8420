"""Output semantics for gold traces: plugin decoders first, then caller-given labels, then (for a
plain classifier's (batch, classes) scores) a top-k of class indices with probabilities.

A synthesized-input trace refuses (``nongold_semantics_unavailable``): a decoded label of random
numbers would be a statement about data that never existed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from .errors import TorchLensError
from .plugins import hook
from .types import DecodedOutput


def main_output(trace) -> torch.Tensor | None:
    """The tensor most likely to hold the model's prediction: ``logits``, else the first."""
    outputs = trace.outputs
    for op in outputs:
        if op.saved and "logits" in str(op.slot):
            return op._value
    return outputs[0]._value if outputs and outputs[0].saved else None


def top_k(logits: torch.Tensor, k: int, labels: Any = None) -> list[dict[str, Any]]:
    """Rows of the k most probable classes of the first item (last position for sequences)."""
    row = logits.detach().float()
    while row.dim() > 1:
        row = row[0] if row.dim() > 2 else row[0]
    if row.dim() == 0:
        return []
    probs = torch.softmax(row, dim=-1)
    values, indices = probs.topk(min(k, probs.numel()))
    out = []
    for rank, (p, i) in enumerate(zip(values.tolist(), indices.tolist()), 1):
        label = None
        if isinstance(labels, Mapping):
            label = labels.get(i, labels.get(str(i)))
        elif isinstance(labels, Sequence) and not isinstance(labels, str) and i < len(labels):
            label = labels[i]
        out.append({"rank": rank, "index": i, "label": label, "prob": p})
    return out


def _last_position(t: torch.Tensor) -> torch.Tensor:
    return t[:, -1] if t.dim() == 3 else t


def decode(trace, k: int = 5, labels: Any = None) -> DecodedOutput:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise TorchLensError(f"k={k!r}: the table size must be a positive int",
                             code="option_invalid", teach=["trace.output_table(k=5)"])
    if trace.meta.get("values") == "meta":
        raise TorchLensError(
            "decode_output/output_table need output values, and this trace's model is on the "
            "meta device (shapes only)", code="meta_values_unavailable",
            teach=["build the model on a real device with its weights, then "
                   "tl.trace(model, x).decode_output()"])
    origin = trace.provenance.get("origin", "gold")
    if origin != "gold":
        raise TorchLensError(
            f"decode_output/output_table refuse on a {origin}-input trace: they would present "
            "random numbers as statements about data; structure, shapes, parameters and costs "
            "stay available", code="nongold_semantics_unavailable",
            teach=["tl.trace(model, x)  # with your real input, then trace.decode_output()"])
    labels = labels if labels is not None else trace._objects.get("labels")
    meta = getattr(labels, "meta", None)  # a torchvision weights enum carries its categories
    if isinstance(meta, Mapping) and "categories" in meta:
        labels = meta["categories"]
    if labels is None:
        decoded = hook().torchlens_decode_output(trace=trace, k=k)
        if decoded is not None:
            return decoded
    logits = main_output(trace)
    if labels is not None and logits is None:
        raise TorchLensError(
            "labels= were given but the output's values were not saved in this trace",
            code="semantics_unavailable",
            teach=["tl.trace(model, x, save='all')  # keep the output, then "
                   "trace.output_table(k=5, labels=[...])"])
    if logits is None or (labels is None and not _class_scores(trace, logits)):
        raise TorchLensError(
            "this output has no known semantics (no plugin decodes it, no labels= were given, "
            "and it is not a (batch, classes) score tensor)", code="semantics_unavailable",
            teach=["trace.output_table(k=5, labels=[...])  # your class names",
                   "trace.output  # the raw output"])
    rows = top_k(_last_position(logits), k, labels)
    best = rows[0] if rows else None
    text = f"{best['label'] if best['label'] is not None else best['index']} " \
           f"(p={best['prob']:.3f})" if best else ""
    return DecodedOutput(text, rows, "labels" if labels is not None else "indices")


def _class_scores(trace, logits: torch.Tensor) -> bool:
    """Whether an output reads as class scores without labels: a floating (batch, classes)
    tensor, or one the model names ``logits``. Softmax over its last dim gives the table."""
    if not logits.is_floating_point() or logits.shape[-1:] in ((), (1,)):
        return False
    named = any(op.saved and "logits" in str(op.slot) for op in trace.outputs)
    return logits.dim() == 2 or named
