"""Rungs 2 and 3 for HF models: recipes and shape candidates from the config, and the teach."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl
from torchlens.errors import TorchLensError
from torchlens.plugins import hook
from torchlens_hf import recipes


def _recipe(model, name, shape=(1, 8), keyword=True):
    return recipes.input_recipe(model, {"name": name, "keyword": keyword, "shape": shape})


def test_recipes_from_static_facts(bert_cls, clip, t5):
    ids = _recipe(bert_cls.model, "input_ids")
    assert (ids.dtype, ids.low, ids.high) == (torch.long, 0, bert_cls.model.config.vocab_size)
    assert _recipe(bert_cls.model, "0", keyword=False) == ids  # positional 0 of a text model
    mask = _recipe(bert_cls.model, "attention_mask")
    assert (mask.dtype, mask.low, mask.high) == (torch.long, 1, 2)
    types = _recipe(bert_cls.model, "token_type_ids")
    assert (types.dtype, types.low, types.high) == (torch.long, 0, 1)
    assert _recipe(t5.model, "decoder_input_ids").high == t5.model.config.vocab_size
    pixels = _recipe(clip.model, "pixel_values", (1, 3, 8, 8))
    assert (pixels.dtype, pixels.low, pixels.high) == (torch.float32, 0.0, 1.0)
    assert _recipe(bert_cls.model, "position_ids") is None
    assert _recipe(torch.nn.Linear(2, 2), "input_ids") is None


def test_pixel_recipe_follows_the_model_dtype(clip):
    from transformers import CLIPVisionModel

    vision = CLIPVisionModel(clip.model.config.vision_config).to(torch.bfloat16)
    assert _recipe(vision, "0", (1, 3, 8, 8), keyword=False).dtype == torch.bfloat16


def test_declared_mapping_synthesizes_ids_ones_and_zeros(bert_cls):
    trace = tl.trace(bert_cls.model, input_shape={
        "input_ids": (2, 12), "attention_mask": (2, 12), "token_type_ids": (2, 12)})
    slots = {s["slot"]: s for s in trace.provenance["slots"]}
    assert [slots[n]["recipe"] for n in ("input_ids", "attention_mask", "token_type_ids")] == [
        "vocab_ids", "ones", "zeros"]
    values = {op.slot: op._value for op in trace.inputs}
    assert values["input_ids"].dtype == torch.long
    assert 0 <= int(values["input_ids"].min()) and int(values["input_ids"].max()) < len(
        bert_cls.tokenizer)
    assert bool((values["attention_mask"] == 1).all())
    assert bool((values["token_type_ids"] == 0).all())


def test_declared_positional_shape_of_a_text_model(gpt2):
    trace = tl.trace(gpt2.model, input_shape=(1, 8))
    slot = trace.provenance["slots"][0]
    assert (slot["slot"], slot["recipe"], slot["high"]) == ("0", "vocab_ids", len(gpt2.tokenizer))
    assert slot["source"] == "torchlens_input_recipe hook"


def test_shape_candidates(gpt2, t5, clip):
    assert recipes.shape_candidates(gpt2.model)[0] == {"input_ids": (1, 16),
                                                       "attention_mask": (1, 16)}
    assert recipes.shape_candidates(t5.model)[0] == {
        "input_ids": (1, 16), "attention_mask": (1, 16), "decoder_input_ids": (1, 16)}
    both = recipes.shape_candidates(clip.model)[0]
    assert both["pixel_values"] == (1, 3, 224, 224) and both["input_ids"] == (1, 16)
    assert recipes.shape_candidates(torch.nn.Linear(2, 2)) is None


def test_candidates_are_bounded_by_the_position_table():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=6, n_embd=16, n_layer=1,
                                       n_head=2, use_cache=False))
    assert recipes.shape_candidates(model)[0]["input_ids"] == (1, 6)


@pytest.mark.parametrize("case", ["gpt2", "bert_mlm", "t5"])
def test_rung3_inference(case, request):
    model = request.getfixturevalue(case).model
    trace = tl.trace(model)
    prov = trace.provenance
    assert prov["origin"] == "inferred" and prov["strategy"] == "inference"
    diary = prov["probe_diary"]
    assert diary[-1]["outcome"] == "verified" and diary[-1]["candidate"]["input_ids"] == [1, 16]
    slots = {s["slot"]: s for s in prov["slots"]}
    assert slots["input_ids"]["recipe"] == "vocab_ids"
    assert slots["attention_mask"]["recipe"] == "ones"
    if case == "t5":
        assert slots["decoder_input_ids"]["high"] == model.config.vocab_size


def test_rung3_refusal_puts_the_prompt_string_first(wordpiece):
    from transformers import BertConfig, BertForMultipleChoice

    # multiple choice wants (batch, choices, seq): every text candidate fails, honestly
    model = BertForMultipleChoice(BertConfig(
        vocab_size=len(wordpiece), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64)).eval()
    with pytest.raises(TorchLensError) as info:
        tl.trace(model)
    err = info.value
    assert err.code == "input_inference_failed"
    assert err.teach[0] == 'tl.trace(model, "The quick brown fox")  # a real prompt string'
    assert err.teach[1].startswith("tl.trace(model, x)")
    assert "input_shape=" in err.teach[2]
    assert err.teach[3].startswith("torchlens.debug.guess_input_shape")
    assert all(row["outcome"] == "failed" for row in err.diary)


def test_refusal_teach_by_modality(clip, gpt2):
    from transformers import CLIPVisionModel

    assert recipes.refusal_teach(gpt2.model)[0].startswith('tl.trace(model, "The quick')
    assert '"image": image' in recipes.refusal_teach(clip.model)[0]
    vision = CLIPVisionModel(clip.model.config.vision_config)
    assert recipes.refusal_teach(vision) is None  # torchlens-vision teaches images
    assert recipes.refusal_teach(torch.nn.Linear(2, 2)) is None


def test_hooks_are_registered_through_the_entry_point(gpt2):
    from torchlens.plugins import list_plugins

    assert any(row["module"] == "torchlens_hf.plugin" for row in list_plugins())
    teach = [t for group in hook().torchlens_refusal_teach(model=gpt2.model) for t in group or []]
    assert teach[0].startswith('tl.trace(model, "The quick brown fox")')
