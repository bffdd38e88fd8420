"""torchvision models: a PIL image (or a batch, or an HWC array) through the caller's transform."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import torchlens as tl

from .conftest import make_image


@pytest.fixture(scope="module")
def small(weights):
    """The weights' own transform at a 64-pixel crop, so batch tests stay fast on 2 cores."""
    return weights.transforms(crop_size=64, resize_size=72)


@pytest.fixture(scope="module")
def gold(resnet18, weights):
    """One resnet18 trace of a PIL image through the IMAGENET1K_V1 transform, with its labels."""
    image = make_image()
    trace = tl.trace(resnet18, image, preprocess=weights.transforms(),
                     labels=weights.meta["categories"])
    return trace, image


def test_pil_image_is_the_transform_applied_by_hand(gold, weights):
    trace, image = gold
    assert torch.equal(trace.inputs[0].out, weights.transforms()(image).unsqueeze(0))
    assert trace.provenance["origin"] == "gold"


def test_provenance_records_image_transform_and_tensor(gold):
    facts = gold[0].provenance["resolver"]
    json.dumps(facts)
    assert facts["plugin"] == "torchlens-vision"
    assert facts["batch_size"] == 1 and facts["source"] == "PIL"
    row = facts["images"][0]
    assert row["size"] == [48, 40] and row["mode"] == "RGB" and row["conversion"] is None
    assert len(row["sha256"]) == 64
    pre = facts["preprocess"]
    assert pre["via"] == "preprocess=" and pre["class"].endswith("ImageClassification")
    assert pre["params"]["mean"] == [0.485, 0.456, 0.406]
    assert pre["params"]["crop_size"] == [224] and "resize_size=[256]" in pre["repr"]
    assert facts["tensors"]["0"] == {"shape": [1, 3, 224, 224], "dtype": "float32",
                                     "device": "cpu"}


def test_decode_with_the_weights_categories(gold, weights):
    trace = gold[0]
    categories = weights.meta["categories"]
    decoded = trace.decode_output()
    assert decoded.rows[0]["label"] in categories
    assert str(decoded).startswith(decoded.rows[0]["label"])
    rows = trace.output_table(k=5)
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(r["label"] == categories[r["index"]] for r in rows)
    probs = [r["prob"] for r in rows]
    assert probs == sorted(probs, reverse=True) and 0 < probs[0] <= 1


def test_a_list_of_images_is_a_batch(resnet18, small):
    images = [make_image(1), make_image(2, size=(30, 50))]
    trace = tl.trace(resnet18, images, preprocess=small)
    assert torch.equal(trace.inputs[0].out, torch.stack([small(i) for i in images]))
    facts = trace.provenance["resolver"]
    assert facts["input"] == "image batch" and facts["batch_size"] == 2
    assert facts["images"][0]["sha256"] != facts["images"][1]["sha256"]
    assert facts["images"][1]["size"] == [30, 50]
    assert facts["tensors"]["0"]["shape"] == [2, 3, 64, 64]


def test_a_weights_enum_gives_the_transform_and_the_labels(resnet18, weights):
    trace = tl.trace(resnet18, make_image(6), preprocess=weights, save=["fc"])
    facts = trace.provenance["resolver"]
    assert facts["preprocess"]["weights"] == "ResNet18_Weights.IMAGENET1K_V1"
    assert facts["tensors"]["0"]["shape"] == [1, 3, 224, 224]
    decoded = trace.decode_output(k=3)
    assert decoded.source == "torchvision weights meta['categories']"
    assert [r["item"] for r in decoded.rows] == [0, 0, 0]
    assert all(r["label"] in weights.meta["categories"] for r in decoded.rows)


def test_labels_may_be_the_weights_enum(resnet18, weights, small):
    trace = tl.trace(resnet18, [make_image(7), make_image(8)], preprocess=small, labels=weights,
                     save=["fc"])
    assert trace.provenance["resolver"]["labels"].startswith("ResNet18_Weights.IMAGENET1K_V1")
    assert trace.output_table(k=2)[0]["label"] in weights.meta["categories"]


def test_numpy_hwc_uint8_array(resnet18, small):
    array = np.asarray(make_image(3))
    transform = small
    trace = tl.trace(resnet18, array, preprocess=transform)
    from PIL import Image

    assert torch.equal(trace.inputs[0].out, transform(Image.fromarray(array)).unsqueeze(0))
    facts = trace.provenance["resolver"]
    assert facts["source"] == "numpy"
    assert facts["images"][0]["array"] == {"shape": [40, 48, 3], "dtype": "uint8",
                                           "layout": "HWC"}


def test_grayscale_rgba_and_palette_are_converted_and_recorded(resnet18, small):
    images = [make_image(4, mode=m) for m in ("L", "RGBA", "P")]
    transform = small
    trace = tl.trace(resnet18, images, preprocess=transform)
    expected = torch.stack([transform(i.convert("RGB")) for i in images])
    assert torch.equal(trace.inputs[0].out, expected)
    rows = trace.provenance["resolver"]["images"]
    assert [r["mode"] for r in rows] == ["L", "RGBA", "P"]
    for row in rows:
        conversion = row["conversion"]
        assert conversion["from"] == row["mode"] and conversion["to"] == "RGB"
        assert conversion["method"] == 'image.convert("RGB")'
        assert "3 channels" in conversion["because"]


def test_a_one_channel_transform_converts_to_grayscale():
    from torchvision import transforms as T

    from .conftest import TinyConv

    model = TinyConv(channels=1, size=8).eval()
    transform = T.Compose([T.Resize((8, 8)), T.ToTensor(), T.Normalize([0.5], [0.5])])
    image = make_image(5, mode="RGBA")
    trace = tl.trace(model, image, preprocess=transform)
    assert torch.equal(trace.inputs[0].out, transform(image.convert("L")).unsqueeze(0))
    conversion = trace.provenance["resolver"]["images"][0]["conversion"]
    assert (conversion["from"], conversion["to"]) == ("RGBA", "L")
    steps = trace.provenance["resolver"]["preprocess"]["steps"]
    assert [s["class"].rsplit(".", 1)[1] for s in steps] == ["Resize", "ToTensor", "Normalize"]


def test_an_attached_transform_is_used(tiny, image):
    from torchvision import transforms as T

    tiny.preprocess = T.Compose([T.Resize((32, 32)), T.ToTensor()])
    trace = tl.trace(tiny, image)
    assert trace.provenance["resolver"]["preprocess"]["via"] == "model.preprocess"
    assert list(trace.inputs[0].out.shape) == [1, 3, 32, 32]


def test_a_plugin_registered_preprocess_is_used(tiny, image):
    from torchvision import transforms as T

    from torchlens.plugins import get_plugin_manager

    class Registered:
        @tl.hookimpl
        def torchlens_image_preprocess(self, model):
            return T.Compose([T.Resize((32, 32)), T.PILToTensor(), T.ConvertImageDtype(
                torch.float32)]) if type(model).__name__ == "TinyConv" else None

    pm = get_plugin_manager()
    plugin = Registered()
    pm.register(plugin, name="test-vision-registered")
    try:
        trace = tl.trace(tiny, image)
    finally:
        pm.unregister(plugin)
    facts = trace.provenance["resolver"]["preprocess"]
    assert facts["via"] == "torchlens_image_preprocess hook"
    assert "conversion" in trace.provenance["resolver"]["images"][0]


def test_no_preprocessing_known_refuses_with_the_ways(tiny, image):
    with pytest.raises(tl.TorchLensError) as info:
        tl.trace(tiny, image)
    err = info.value
    assert err.code == "preprocess_unavailable" and isinstance(err, ValueError)
    teach = "\n".join(err.teach)
    assert "preprocess=weights.transforms()" in err.teach[0]
    assert "model.preprocess = " in teach
    assert ".unsqueeze(0)" in teach  # pass a tensor yourself
    assert "torchlens_image_preprocess" in teach
    assert "default normalization" in err.message


def test_a_transform_that_returns_no_tensor_is_a_typed_error(tiny, image):
    from torchvision import transforms as T

    with pytest.raises(tl.TorchLensError) as info:
        tl.trace(tiny, image, preprocess=T.Resize((32, 32)))
    assert info.value.code == "preprocess_failed"
    assert any("ToTensor" in t for t in info.value.teach)


def test_provenance_survives_save_and_load(tiny, image, tmp_path):
    from torchvision import transforms as T

    trace = tl.trace(tiny, image, preprocess=T.Compose([T.Resize((32, 32)), T.ToTensor()]))
    path = tmp_path / "trace.tl"
    trace.save(path)
    assert tl.load(path).provenance["resolver"] == trace.provenance["resolver"]
