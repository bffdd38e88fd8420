"""A prompt string is a gold input for HF models, tokenized with the model's own tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

import torchlens as tl
from torchlens.errors import TorchLensError

PROMPT = "The quick brown fox"


def _kwargs_of(trace) -> dict[str, list]:
    return {op.slot: op._value.tolist() for op in trace.inputs}


def test_string_is_a_gold_input_with_tokenizer_provenance(gpt2):
    trace = tl.trace(gpt2.model, PROMPT)
    prov = trace.provenance
    facts = prov["resolver"]
    expected = gpt2.tokenizer(PROMPT)["input_ids"]
    assert prov["origin"] == "gold"
    assert facts["plugin"] == "torchlens-hf"
    assert facts["text"] == PROMPT
    assert facts["input_ids"] == [expected]
    assert facts["tokens"] == [gpt2.tokenizer.convert_ids_to_tokens(expected)]
    assert _kwargs_of(trace)["input_ids"] == [expected]
    tok = facts["tokenizer"]
    assert tok["name_or_path"] == str(gpt2.path)
    assert tok["source"] == "name_or_path"
    assert tok["class"] == type(gpt2.tokenizer).__name__
    assert tok["vocab_size"] == len(gpt2.tokenizer)
    assert tok["padding_side"] == gpt2.tokenizer.padding_side
    assert tok["special_tokens_added"] == {"prefix": [], "suffix": [], "bos": False,
                                           "eos": False}
    assert len(tok["sha256"]) == 64
    json.dumps(prov)  # the whole record is JSON-safe


def test_special_tokens_added_are_disclosed(bert_mlm, t5):
    bert = tl.trace(bert_mlm.model, PROMPT).provenance["resolver"]
    added = bert["tokenizer"]["special_tokens_added"]
    assert (added["prefix"], added["suffix"]) == (["[CLS]"], ["[SEP]"])
    assert bert["tokens"][0][0] == "[CLS]" and bert["tokens"][0][-1] == "[SEP]"
    wrapped = tl.trace(t5.model, PROMPT).provenance["resolver"]["tokenizer"]
    assert wrapped["special_tokens_added"]["bos"] and wrapped["special_tokens_added"]["eos"]


def test_same_tokenizer_same_hash_different_tokenizer_different_hash(bert_mlm, bert_cls, gpt2):
    hashes = [tl.trace(c.model, PROMPT).provenance["resolver"]["tokenizer"]["sha256"]
              for c in (bert_mlm, bert_cls, gpt2)]
    assert hashes[0] == hashes[1] != hashes[2]


def test_list_of_strings_is_a_padded_batch(bert_mlm):
    texts = ["hello world", "the quick brown fox jumps over the lazy dog"]
    trace = tl.trace(bert_mlm.model, texts)
    facts = trace.provenance["resolver"]
    expected = bert_mlm.tokenizer(texts, padding=True, return_tensors="pt")
    assert facts["batch_size"] == 2 and facts["call"]["padding"] is True
    assert facts["input_ids"] == expected["input_ids"].tolist()
    assert facts["attention_mask"] == expected["attention_mask"].tolist()
    assert "[PAD]" in facts["tokens"][0]
    assert trace.inputs[0].shape == list(expected["input_ids"].shape)


def test_batch_without_pad_token_refuses(gpt2):
    with pytest.raises(TorchLensError) as info:
        tl.trace(gpt2.model, ["hello", "the quick brown fox jumps"])
    assert info.value.code == "tokenizer_padding_unavailable"
    assert info.value.teach[0].startswith("tok.pad_token = tok.eos_token")


def test_tokenizer_option_and_attached_tokenizer(wordpiece):
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig(vocab_size=len(wordpiece), hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=64)).eval()
    assert model.name_or_path == ""
    given = tl.trace(model, PROMPT, tokenizer=wordpiece).provenance["resolver"]
    assert given["tokenizer"]["source"] == "option"
    model.tokenizer = wordpiece
    attached = tl.trace(model, PROMPT).provenance["resolver"]
    assert attached["tokenizer"]["source"] == "attribute"
    assert given["input_ids"] == attached["input_ids"] == [wordpiece(PROMPT)["input_ids"]]


def test_no_tokenizer_refuses_with_the_remedies(tmp_path, wordpiece):
    from transformers import AutoModel, BertConfig, BertModel

    model = BertModel(BertConfig(vocab_size=len(wordpiece), hidden_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, intermediate_size=64)).eval()
    with pytest.raises(TorchLensError) as info:
        tl.trace(model, PROMPT)
    assert info.value.code == "tokenizer_unavailable"
    teach = info.value.teach
    assert "tokenizer=AutoTokenizer.from_pretrained(" in teach[0]
    assert teach[1].startswith("model.tokenizer = tok")
    assert 'tok(text, return_tensors="pt")' in teach[2]
    # saved without its tokenizer: transformers would build an empty one; we refuse instead
    model.save_pretrained(tmp_path)
    reloaded = AutoModel.from_pretrained(tmp_path)
    with pytest.raises(TorchLensError) as info:
        tl.trace(reloaded, PROMPT)
    assert info.value.code == "tokenizer_unavailable"
    assert repr(str(tmp_path)) in info.value.teach[0]


def test_foreign_tokenizer_refuses_before_the_forward(bert_mlm, gpt2):
    with pytest.raises(TorchLensError) as info:
        tl.trace(bert_mlm.model, "zebra quixotic jump", tokenizer=gpt2.tokenizer)
    assert info.value.code == "tokenizer_model_mismatch"


def test_batch_encoding_passes_as_forward_keywords(bert_cls):
    encoding = bert_cls.tokenizer(PROMPT, return_tensors="pt")
    trace = tl.trace(bert_cls.model, encoding)
    facts = trace.provenance["resolver"]
    assert trace.provenance["origin"] == "gold"
    assert facts["kind"] == "BatchEncoding"
    assert set(facts["forward_kwargs"]) == set(encoding)
    assert facts["input_ids"] == encoding["input_ids"].tolist()
    assert facts["tokens"] == [bert_cls.tokenizer.convert_ids_to_tokens(encoding["input_ids"][0])]
    assert _kwargs_of(trace)["input_ids"] == encoding["input_ids"].tolist()


def test_encoder_decoder_gets_the_disclosed_decoder_start(t5):
    trace = tl.trace(t5.model, PROMPT)
    facts = trace.provenance["resolver"]
    start = t5.model.config.decoder_start_token_id
    assert facts["decoder_input_ids"]["ids"] == [[start]]
    assert _kwargs_of(trace)["decoder_input_ids"] == [[start]]
    assert set(facts["forward_kwargs"]) == {"input_ids", "attention_mask", "decoder_input_ids"}


def test_real_minilm_from_a_sentence(minilm):
    sentence = "TorchLens traces a real sentence through MiniLM."
    trace = tl.trace(minilm.model, sentence)
    facts = trace.provenance["resolver"]
    expected = minilm.tokenizer(sentence, return_tensors="pt")
    assert trace.provenance["origin"] == "gold"
    assert facts["tokenizer"]["name_or_path"] == str(minilm.path)
    assert facts["tokenizer"]["vocab_size"] == 30522
    assert facts["input_ids"] == expected["input_ids"].tolist()
    assert facts["tokens"][0][:2] == ["[CLS]", "torch"]
    with torch.no_grad():
        direct = minilm.model(**expected).last_hidden_state
    out = next(op for op in trace.outputs if "last_hidden_state" in op.slot)
    torch.testing.assert_close(out._value, direct)


def test_resolver_facts_survive_save_and_load(bert_cls, tmp_path):
    trace = tl.trace(bert_cls.model, ["hello world", "the lazy dog"])
    trace.save(tmp_path / "t.tl")
    loaded = tl.load(tmp_path / "t.tl")
    assert loaded.provenance["resolver"] == trace.provenance["resolver"]
    assert loaded.provenance["resolver"]["tokenizer"]["name_or_path"] == str(bert_cls.path)
