"""Output semantics of gold traces of HF models: next tokens, labels, mask fills, matches.

The core refuses synthesized-input traces before calling here. A head with no semantics (a base
encoder's hidden states) refuses ``semantics_unavailable``; other models return None.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchlens.errors import TorchLensError
from torchlens.types import DecodedOutput

from .models import head_kind, is_hf_model
from .tokenizer import find_tokenizer

SOURCE = "torchlens-hf"


def _refuse(message: str, teach: list[str]) -> TorchLensError:
    return TorchLensError(message, code="semantics_unavailable", teach=teach)


def _output(trace, name: str = "logits") -> torch.Tensor:
    """The named output tensor (``['logits']``), else the first output, as saved."""
    outputs = [op for op in trace.outputs if op.saved and isinstance(op._value, torch.Tensor)]
    for op in outputs:
        if str(op.slot) in (f"['{name}']", f'["{name}"]', f".{name}"):
            return op._value
    for op in outputs:
        if str(op.slot) in ("[0]", "", "None"):
            return op._value
    if outputs:
        return outputs[0]._value
    raise _refuse("the trace kept no output tensors to decode",
                  ['tl.trace(model, x, save="all")  # the default keeps the outputs'])


def _input_ids(trace) -> list[list[int]] | None:
    facts = trace.provenance.get("resolver") or {}
    if facts.get("input_ids") is not None:
        return facts["input_ids"]
    for op in trace.inputs:
        if op.slot == "input_ids" and op.saved and isinstance(op._value, torch.Tensor):
            return op._value.tolist()
    return None


def _attention_mask(trace) -> list[list[int]] | None:
    facts = trace.provenance.get("resolver") or {}
    if facts.get("attention_mask") is not None:
        return facts["attention_mask"]
    for op in trace.inputs:
        if op.slot == "attention_mask" and op.saved and isinstance(op._value, torch.Tensor):
            return op._value.tolist()
    return None


def _last_real_position(mask: list[list[int]] | None, item: int, length: int) -> int:
    if not mask or item >= len(mask):
        return length - 1
    real = [i for i, m in enumerate(mask[item]) if m]
    return real[-1] if real else length - 1


def _token_text(tok: Any, index: int) -> tuple[str | None, str | None]:
    """(decoded text, raw token) for one id, or (None, None) without a tokenizer."""
    if tok is None:
        return None, None
    return tok.decode([index]), tok.convert_ids_to_tokens(index)


def _top_tokens(probs: torch.Tensor, k: int, tok: Any, **where: int) -> list[dict[str, Any]]:
    values, indices = probs.topk(min(k, probs.numel()))
    rows = []
    for rank, (p, i) in enumerate(zip(values.tolist(), indices.tolist()), 1):
        text, token = _token_text(tok, i)
        rows.append({**where, "rank": rank, "index": i, "label": text, "token": token, "prob": p})
    return rows


def _best_text(rows: list[dict[str, Any]]) -> str:
    best = [r for r in rows if r["rank"] == 1]
    return " | ".join(r["label"] if r["label"] is not None else f"<id {r['index']}>"
                      for r in best)


def next_token(trace, model: nn.Module, tok: Any, k: int, seq2seq: bool) -> DecodedOutput:
    """Causal and seq2seq LMs: the next token after the (last real) position, with top-k."""
    logits = _output(trace).detach().float()
    mask = None if seq2seq else _attention_mask(trace)
    rows = []
    for item in range(logits.shape[0]):
        pos = _last_real_position(mask, item, logits.shape[1])
        probs = torch.softmax(logits[item, pos], dim=-1)
        rows += _top_tokens(probs, k, tok, item=item, position=pos)
    return DecodedOutput(_best_text(rows), rows, f"{SOURCE}: next token")


def classes(trace, model: nn.Module, k: int) -> DecodedOutput:
    """Sequence classification: labels from ``config.id2label``."""
    logits = _output(trace).detach().float()
    labels = getattr(model.config, "id2label", None) or {}
    multi = getattr(model.config, "problem_type", None) == "multi_label_classification"
    rows = []
    for item in range(logits.shape[0]):
        scores = torch.sigmoid(logits[item]) if multi else torch.softmax(logits[item], dim=-1)
        values, indices = scores.topk(min(k, scores.numel()))
        for rank, (p, i) in enumerate(zip(values.tolist(), indices.tolist()), 1):
            rows.append({"item": item, "rank": rank, "index": i,
                         "label": labels.get(i, labels.get(str(i))), "prob": p})
    return DecodedOutput(_best_text(rows), rows, f"{SOURCE}: config.id2label")


def token_classes(trace, model: nn.Module, tok: Any) -> DecodedOutput:
    """Token classification: the best label of every real token, from ``config.id2label``."""
    logits = _output(trace).detach().float()
    labels = getattr(model.config, "id2label", None) or {}
    ids, mask = _input_ids(trace), _attention_mask(trace)
    rows = []
    for item in range(logits.shape[0]):
        probs = torch.softmax(logits[item], dim=-1)
        for pos in range(logits.shape[1]):
            if mask and not mask[item][pos]:
                continue
            p, i = probs[pos].max(dim=-1)
            token = tok.convert_ids_to_tokens(ids[item][pos]) if tok and ids else None
            rows.append({"item": item, "position": pos, "token": token, "rank": 1,
                         "index": int(i), "label": labels.get(int(i), labels.get(str(int(i)))),
                         "prob": float(p)})
    text = " ".join(f"{r['token'] if r['token'] is not None else r['position']}/{r['label']}"
                    for r in rows if r["item"] == 0)
    return DecodedOutput(text, rows, f"{SOURCE}: config.id2label per token")


def mask_fills(trace, model: nn.Module, tok: Any, k: int) -> DecodedOutput:
    """Masked LM: the top-k fills at every mask position."""
    mask_id = getattr(tok, "mask_token_id", None)
    ids = _input_ids(trace)
    if tok is None or mask_id is None or ids is None:
        raise _refuse("a masked LM's fills need its tokenizer's mask token and the input ids",
                      ["tl.trace(model, text, tokenizer=tok)  # a string with tok.mask_token"])
    logits = _output(trace).detach().float()
    rows = []
    for item, row in enumerate(ids):
        for pos in (p for p, i in enumerate(row) if i == mask_id):
            probs = torch.softmax(logits[item, pos], dim=-1)
            rows += _top_tokens(probs, k, tok, item=item, position=pos)
    if not rows:
        raise _refuse(
            f"the input holds no mask token ({tok.mask_token!r}), so there is nothing to fill",
            [f'tl.trace(model, "The quick brown {tok.mask_token} jumps.")  # mark the blank'])
    return DecodedOutput(_best_text(rows), rows, f"{SOURCE}: mask fills")


def image_text_matches(trace, k: int) -> DecodedOutput:
    """CLIP-like models: for each image, the given texts ranked by probability."""
    texts = (trace.provenance.get("resolver") or {}).get("text")
    texts = [texts] if isinstance(texts, str) else texts
    logits = _output(trace, "logits_per_image").detach().float()
    rows = []
    for item in range(logits.shape[0]):
        probs = torch.softmax(logits[item], dim=-1)
        values, indices = probs.topk(min(k, probs.numel()))
        for rank, (p, i) in enumerate(zip(values.tolist(), indices.tolist()), 1):
            label = texts[i] if texts and i < len(texts) else None
            rows.append({"item": item, "rank": rank, "index": i, "label": label, "prob": p})
    return DecodedOutput(_best_text(rows), rows, f"{SOURCE}: image-text similarity")


def decode_output(trace, k: int) -> DecodedOutput | None:
    """The decoded output for a gold trace of an HF model, or None when not ours."""
    model = trace._objects.get("model")
    if model is None or not is_hf_model(model):
        return None
    kind = head_kind(model)
    tok = trace._objects.get("tokenizer")
    if tok is None and kind in ("causal_lm", "seq2seq_lm", "masked_lm", "token_classification"):
        tok = find_tokenizer(model, {}, required=False)[0]
    if kind in ("causal_lm", "seq2seq_lm"):
        return next_token(trace, model, tok, k, seq2seq=kind == "seq2seq_lm")
    if kind == "sequence_classification":  # image classifiers: torchlens-vision decodes them
        return classes(trace, model, k)
    if kind == "token_classification":
        return token_classes(trace, model, tok)
    if kind == "image_text_similarity":
        return image_text_matches(trace, k)
    if kind == "masked_lm":
        return mask_fills(trace, model, tok, k)
    if kind == "base":
        raise _refuse(
            f"{type(model).__name__} is a base model: its outputs are hidden states, which have "
            "no tokens or labels to decode",
            ["trace.output  # the raw hidden states",
             "AutoModelForSequenceClassification.from_pretrained(path)  # a head with labels",
             "AutoModelForMaskedLM.from_pretrained(path)  # or a language-model head"])
    return None
