"""CLIP: a modality dict through the model's own processor, and the spec's mapping input_shape."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import torchlens as tl
from torchlens.errors import TorchLensError

from .conftest import IMAGE_SIZE


def test_modality_dict_resolves_through_the_processor(clip, image):
    trace = tl.trace(clip.model, {"text": "a photo of a cat", "image": image})
    facts = trace.provenance["resolver"]
    expected = clip.processor(text="a photo of a cat", images=image, return_tensors="pt")
    assert trace.provenance["origin"] == "gold"
    assert facts["kind"] == "modality" and facts["modalities"] == ["image", "text"]
    assert facts["processor"]["class"] == "CLIPProcessor"
    assert facts["processor"]["source"] == "name_or_path"
    assert facts["processor"]["image_processor"] == "CLIPImageProcessor"
    assert facts["images"][0]["size"] == [48, 40]
    assert facts["input_ids"] == expected["input_ids"].tolist()
    assert facts["tokenizer"]["name_or_path"] == str(clip.path)
    assert facts["shapes"]["pixel_values"] == [1, 3, IMAGE_SIZE, IMAGE_SIZE]
    values = {op.slot: op._value for op in trace.inputs}
    torch.testing.assert_close(values["pixel_values"], expected["pixel_values"])
    json.dumps(trace.provenance)


def test_modality_dict_with_lists_and_processor_option(clip, image):
    config = copy.deepcopy(clip.model.config)
    config.name_or_path = ""  # built from a config: no folder to find a processor in
    model = type(clip.model)(config).eval()
    assert model.name_or_path == ""
    with pytest.raises(TorchLensError) as info:
        tl.trace(model, {"text": ["a cat"], "image": [image]})
    assert info.value.code == "processor_unavailable"
    assert "processor=AutoProcessor.from_pretrained(" in info.value.teach[0]
    texts = ["a cat", "a photo of a lazy dog"]
    trace = tl.trace(model, {"text": texts, "images": [image, image]}, processor=clip.processor)
    facts = trace.provenance["resolver"]
    assert facts["processor"]["source"] == "option"
    assert facts["call"]["padding"] is True
    assert len(facts["images"]) == 2 and len(facts["input_ids"]) == 2


def test_spec_mapping_input_shape_on_clip(clip):
    trace = tl.trace(clip.model, input_shape={
        "input_ids": (1, 16),
        "pixel_values": (1, 3, 224, 224),
        "attention_mask": (1, 16),
    })
    prov = trace.provenance
    slots = {s["slot"]: s for s in prov["slots"]}
    assert prov["origin"] == "declared"
    assert slots["input_ids"]["recipe"] == "vocab_ids"
    assert slots["input_ids"]["high"] == clip.model.config.text_config.vocab_size
    assert slots["attention_mask"]["recipe"] == "ones"
    assert slots["pixel_values"]["recipe"] == "uniform_0_1"
    assert slots["pixel_values"]["dtype"] == "float32"
    values = {op.slot: op._value for op in trace.inputs}
    assert values["input_ids"].max() < clip.model.config.text_config.vocab_size
    assert bool((values["attention_mask"] == 1).all())


def test_clip_rung3_uses_both_towers(clip):
    trace = tl.trace(clip.model)
    prov = trace.provenance
    assert prov["origin"] == "inferred"
    assert prov["probe_diary"][0]["outcome"] == "verified"
    assert prov["probe_diary"][0]["candidate"] == {
        "input_ids": [1, 16], "pixel_values": [1, 3, IMAGE_SIZE, IMAGE_SIZE],
        "attention_mask": [1, 16]}


def test_clip_refuses_a_missing_modality_before_the_forward(clip, image):
    for value in ("a photo of a cat", {"text": "a cat"}, {"image": image}):
        with pytest.raises(TorchLensError) as info:
            tl.trace(clip.model, value)
        assert info.value.code == "input_modality_missing"
        assert info.value.teach[0] == (
            'tl.trace(model, {"text": "a photo of a cat", "image": image})')


def test_processor_output_is_cast_to_the_model_dtype_and_disclosed(clip, image):
    model = copy.deepcopy(clip.model).to(torch.bfloat16)
    trace = tl.trace(model, {"text": "a cat", "image": image})
    facts = trace.provenance["resolver"]
    assert facts["cast"] == {"pixel_values": "float32 -> bfloat16"}
    assert {op.slot: op.dtype for op in trace.inputs}["pixel_values"] == "bfloat16"


def test_clip_decodes_which_text_matches_the_image(clip, image):
    texts = ["a photo of a cat", "a lazy dog", "hello world"]
    trace = tl.trace(clip.model, {"text": texts, "image": image})
    rows = trace.output_table(k=3)
    assert sorted(r["label"] for r in rows) == sorted(texts)
    assert sum(r["prob"] for r in rows) == pytest.approx(1.0, abs=1e-5)
    assert trace.decode_output().text == rows[0]["label"]


def test_processor_output_passes_as_forward_keywords(clip, image):
    features = clip.processor(text="a cat", images=image, return_tensors="pt")
    trace = tl.trace(clip.model, features)
    facts = trace.provenance["resolver"]
    assert facts["kind"] == "BatchFeature"
    assert set(facts["forward_kwargs"]) == {"input_ids", "attention_mask", "pixel_values"}
