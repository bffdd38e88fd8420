"""Output semantics of gold HF traces: next token, labels, mask fills, and the refusals."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl
from torchlens.errors import TorchLensError

from .conftest import LABELS


def test_causal_lm_next_token_and_top_k(gpt2):
    prompt = "The quick brown fox"
    trace = tl.trace(gpt2.model, prompt)
    decoded = trace.decode_output()
    ids = gpt2.tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        probs = torch.softmax(gpt2.model(**ids).logits[0, -1], dim=-1)
    best = int(probs.argmax())
    assert decoded.text == gpt2.tokenizer.decode([best])
    rows = trace.output_table(k=3)
    assert [r["rank"] for r in rows] == [1, 2, 3]
    assert rows[0]["index"] == best and rows[0]["token"] == gpt2.tokenizer.convert_ids_to_tokens(
        best)
    assert rows[0]["prob"] == pytest.approx(float(probs[best]), abs=1e-5)
    assert rows[0]["prob"] >= rows[1]["prob"] >= rows[2]["prob"]


def test_batched_causal_lm_decodes_each_prompt_at_its_last_real_token(t5, gpt2):
    texts = ["hello", "the quick brown fox jumps"]
    gpt2.tokenizer.pad_token = gpt2.tokenizer.eos_token
    try:
        trace = tl.trace(gpt2.model, texts, tokenizer=gpt2.tokenizer)
    finally:
        gpt2.tokenizer.pad_token = None
    rows = trace.output_table(k=1)
    mask = trace.provenance["resolver"]["attention_mask"]
    assert [r["position"] for r in rows] == [sum(m) - 1 for m in mask]
    assert len(trace.decode_output().text.split(" | ")) == 2


def test_seq2seq_decodes_the_first_generated_token(t5):
    trace = tl.trace(t5.model, "translate: the quick brown fox")
    rows = trace.output_table(k=2)
    assert len(rows) == 2 and rows[0]["position"] == 0
    assert trace.decode_output().text == t5.tokenizer.decode([rows[0]["index"]])


def test_masked_lm_top_k_fills(bert_mlm):
    text = "the quick brown [MASK] jumps"
    trace = tl.trace(bert_mlm.model, text)
    rows = trace.output_table(k=4)
    position = trace.provenance["resolver"]["tokens"][0].index("[MASK]")
    assert len(rows) == 4 and {r["position"] for r in rows} == {position}
    enc = bert_mlm.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        best = int(bert_mlm.model(**enc).logits[0, position].argmax())
    assert rows[0]["index"] == best
    assert trace.decode_output().text == bert_mlm.tokenizer.decode([best])


def test_masked_lm_without_a_mask_refuses(bert_mlm):
    trace = tl.trace(bert_mlm.model, "the quick brown fox")
    with pytest.raises(TorchLensError) as info:
        trace.decode_output()
    assert info.value.code == "semantics_unavailable"
    assert "[MASK]" in info.value.teach[0]


def test_sequence_classification_labels(bert_cls):
    trace = tl.trace(bert_cls.model, ["the weather is nice", "the lazy dog"])
    rows = trace.output_table(k=3)
    assert {r["label"] for r in rows} == set(LABELS.values())
    first = [r for r in rows if r["item"] == 0]
    assert sum(r["prob"] for r in first) == pytest.approx(1.0, abs=1e-5)
    assert trace.decode_output().text.split(" | ")[0] == first[0]["label"]


def test_token_classification_labels(wordpiece):
    from transformers import BertConfig, BertForTokenClassification

    model = BertForTokenClassification(BertConfig(
        vocab_size=len(wordpiece), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, num_labels=2, id2label={0: "O", 1: "ENT"})).eval()
    trace = tl.trace(model, "hello world", tokenizer=wordpiece)
    rows = trace.output_table()
    assert [r["token"] for r in rows] == trace.provenance["resolver"]["tokens"][0]
    assert {r["label"] for r in rows} <= {"O", "ENT"}


def test_base_model_refuses_semantics_unavailable(bert_base, minilm):
    for case in (bert_base, minilm):
        trace = tl.trace(case.model, "hello world")
        with pytest.raises(TorchLensError) as info:
            trace.decode_output()
        assert info.value.code == "semantics_unavailable"
        assert info.value.teach[0].startswith("trace.output")


def test_declared_trace_refuses_nongold_semantics(gpt2):
    trace = tl.trace(gpt2.model, input_shape={"input_ids": (1, 8)})
    with pytest.raises(TorchLensError) as info:
        trace.output_table(k=3)
    assert info.value.code == "nongold_semantics_unavailable"
