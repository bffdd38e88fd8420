"""The plugin's other hooks: describe_input, shape candidates, decode boundaries, non-images."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.plugins import hook
from torchlens_vision import models, resolve

from .conftest import TinyConv, make_image


def test_describe_input_gives_size_mode_and_hash(image):
    facts = hook().torchlens_describe_input(value=image)
    assert facts["size"] == [48, 40] and facts["mode"] == "RGB"
    assert facts["sha256"] == hook().torchlens_describe_input(value=image.copy())["sha256"]
    assert facts["sha256"] != hook().torchlens_describe_input(value=make_image(1))["sha256"]
    palette = make_image(2, mode="P")
    recoloured = palette.copy()
    recoloured.putpalette([255 - v for v in palette.getpalette()])
    assert hook().torchlens_describe_input(value=palette)["sha256"] != \
        hook().torchlens_describe_input(value=recoloured)["sha256"]


def test_non_images_are_not_claimed(tiny):
    fake = type("Image", (), {"__module__": "PIL.Image"})()
    for value in ("a cat", [1, 2], fake, {"text": "x"}, torch.zeros(3), []):
        assert resolve.resolve_image(tiny, value, "trace", {}) is None
    assert hook().torchlens_describe_input(value=fake) is None


def test_rung3_candidates_for_a_conv_model():
    model = TinyConv(channels=1, size=32).eval()
    assert models.shape_candidates(model) == [(1, 1, 224, 224), (1, 1, 32, 32), (1, 1, 256, 256),
                                              (1, 1, 299, 299)]
    trace = tl.trace(model, save=None)
    diary = trace.provenance["probe_diary"]
    assert [(r["candidate"], r["outcome"]) for r in diary] == [
        ([1, 1, 224, 224], "failed"), ([1, 1, 32, 32], "verified")]


def test_no_candidates_for_models_that_are_not_vision():
    text = nn.Sequential(nn.Embedding(10, 4), nn.Conv2d(1, 1, 1))
    assert models.shape_candidates(text) == []
    assert models.shape_candidates(nn.Linear(3, 2)) == []
    assert not models.is_vision_model(nn.Linear(3, 2))


def test_decode_leaves_other_models_to_core():
    """Not a vision model: the plugin answers nothing, and core gives class indices (issue 18)."""
    model = nn.Linear(4, 3).eval()
    trace = tl.trace(model, torch.rand(1, 4))
    decoded = trace.decode_output()
    assert decoded.source == "indices" and all(r["label"] is None for r in decoded.rows)


def test_synthesized_vision_traces_still_refuse_semantics(tiny):
    trace = tl.trace(tiny, input_shape=(1, 3, 32, 32))
    with pytest.raises(tl.TorchLensError) as info:
        trace.output_table(k=2)
    assert info.value.code == "nongold_semantics_unavailable"


def test_a_model_on_a_dtype_gets_the_image_in_that_dtype(image):
    from torchvision import transforms as T

    model = TinyConv(size=16).to(torch.float64).eval()
    trace = tl.trace(model, image, preprocess=T.Compose([T.Resize((16, 16)), T.ToTensor()]))
    assert trace.provenance["resolver"]["tensors"]["0"]["dtype"] == "float64"


def test_a_failed_inference_teaches_a_real_image_first():
    model = TinyConv(size=17).eval()  # runs at 17 x 17 only: no candidate fits
    with pytest.raises(tl.TorchLensError) as info:
        tl.trace(model, save=None)
    assert info.value.code == "input_inference_failed"
    assert "PIL.Image.open" in info.value.teach[0]
    assert "preprocess=weights.transforms()" in info.value.teach[0]
