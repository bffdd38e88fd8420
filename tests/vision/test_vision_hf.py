"""An HF ViT classifier: the image processor saved with the model is found offline."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl

from .conftest import make_image

LABELS = {0: "cat", 1: "dog", 2: "fish"}


def _vit():
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=64, num_labels=3,
                       id2label=LABELS, label2id={v: k for k, v in LABELS.items()})
    torch.manual_seed(0)
    return ViTForImageClassification(config).eval()


@pytest.fixture(scope="module")
def vit(tmp_path_factory):
    """A tiny ViT and its ViTImageProcessor saved to a folder, reloaded with from_pretrained."""
    from transformers import ViTForImageClassification, ViTImageProcessor

    folder = tmp_path_factory.mktemp("vit")
    _vit().save_pretrained(folder)
    processor = ViTImageProcessor(size={"height": 32, "width": 32})
    processor.save_pretrained(folder)
    return ViTForImageClassification.from_pretrained(folder).eval(), processor, str(folder)


def test_saved_processor_is_found_offline_and_labels_come_from_id2label(vit):
    model, processor, folder = vit
    image = make_image(10, size=(50, 40))
    trace = tl.trace(model, image)
    expected = processor(images=[image], return_tensors="pt")["pixel_values"]
    assert torch.equal(trace.inputs[0].out, expected)
    slot = trace.provenance["slots"][0]
    assert slot["slot"] == "pixel_values" and slot["keyword"] is True
    facts = trace.provenance["resolver"]
    assert facts["plugin"] == "torchlens-vision"
    pre = facts["preprocess"]
    assert pre["via"] == "AutoImageProcessor.from_pretrained(name_or_path)"
    assert pre["class"].endswith("ViTImageProcessor") and pre["kind"] == "hf_image_processor"
    assert pre["params"]["size"] == {"height": 32, "width": 32}
    assert pre["loaded_from"] == folder
    assert facts["tensors"]["pixel_values"]["shape"] == [1, 3, 32, 32]
    decoded = trace.decode_output()
    assert decoded.source == "config.id2label"
    assert decoded.rows[0]["label"] in LABELS.values()
    rows = trace.output_table(k=3)
    assert sorted(r["label"] for r in rows) == ["cat", "dog", "fish"]
    assert abs(sum(r["prob"] for r in rows) - 1) < 1e-5


def test_processor_option_and_alpha_composited_on_white(vit):
    from PIL import Image

    model, processor, _ = vit
    image = make_image(11, mode="RGBA")
    trace = tl.trace(model, [image, make_image(12, mode="L")], processor=processor)
    facts = trace.provenance["resolver"]
    assert facts["preprocess"]["via"] == "processor="
    rgba, gray = (row["conversion"] for row in facts["images"])
    assert (rgba["from"], rgba["to"]) == ("RGBA", "RGB") and "alpha_composite" in rgba["method"]
    assert (gray["from"], gray["to"]) == ("L", "RGB") and "image_mean" in gray["because"]
    white = Image.new("RGBA", image.size, (255, 255, 255, 255))
    expected = processor(images=[Image.alpha_composite(white, image).convert("RGB")],
                         return_tensors="pt")["pixel_values"]
    assert torch.equal(trace.inputs[0].out[:1], expected)
    assert [r["item"] for r in trace.output_table(k=1)] == [0, 1]


def test_an_hf_model_without_a_saved_processor_refuses(tmp_path):
    model = _vit()  # built from a config: no name_or_path, nothing saved
    with pytest.raises(tl.TorchLensError) as info:
        tl.trace(model, make_image(13))
    err = info.value
    assert err.code == "preprocess_unavailable"
    assert "AutoImageProcessor" in err.teach[0] and "processor=" in err.teach[0]
    assert any(".unsqueeze(0)" in t for t in err.teach)


def test_a_folder_without_a_tokenizer_loads_where_transformers_raises_key_error(vit, monkeypatch):
    """Asked for the tokenizer of a config that has none, transformers 4 raises KeyError (5
    raises ValueError): the folder loads all the same, without a tokenizer."""
    import transformers

    from torchlens.plugins import hook

    def no_tokenizer(*args, **kwargs):
        raise KeyError(transformers.ViTConfig)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_tokenizer)
    model = hook().torchlens_load_model(path=vit[2], meta=False)
    assert type(model).__name__ == "ViTForImageClassification" and not model.training
    assert getattr(model, "tokenizer", None) is None


def test_rung3_uses_the_config_image_size(vit):
    trace = tl.trace(vit[0], save=None)
    diary = trace.provenance["probe_diary"]
    assert diary[0]["candidate"] == {"pixel_values": [1, 3, 32, 32]}
    assert diary[0]["outcome"] == "verified"


def test_a_tensor_traced_vit_still_decodes_its_labels(vit):
    trace = tl.trace(vit[0], torch.rand(2, 3, 32, 32))
    rows = trace.output_table(k=2)
    assert [r["item"] for r in rows] == [0, 0, 1, 1]
    assert {r["label"] for r in rows} <= set(LABELS.values())


def test_an_image_alone_refuses_for_a_two_tower_model():
    from transformers import CLIPConfig, CLIPModel

    tiny = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    config = CLIPConfig(text_config=dict(vocab_size=50, **tiny),
                        vision_config=dict(image_size=32, patch_size=8, **tiny), projection_dim=8)
    with pytest.raises(tl.TorchLensError) as info:
        tl.trace(CLIPModel(config).eval(), make_image(14))
    assert info.value.code == "input_modality_missing"
    assert '"image": image' in info.value.teach[0]


def test_the_command_line_records_a_folder_of_images(vit, tmp_path):
    """``torchlens record FOLDER --inputs images/``: each image through the saved processor."""
    from torchlens.cli import main

    model, processor, folder = vit
    images = tmp_path / "images"
    images.mkdir()
    for k in range(3):
        make_image(k, size=(40 + k, 36)).save(images / f"img{k}.png")
    (images / "notes.txt").write_text("not an image")
    args = ["record", folder, "--inputs", str(images), "--save", "vit.layers.0",
            "--reduce", "mean", "--to", str(tmp_path / "acts"), "--no-progress"]
    assert main(args) == 0
    rec = tl.recording.open(tmp_path / "acts")
    assert len(rec) == 3 and rec.provenance["origins"] == {"gold": 3}
    from PIL import Image

    for k in range(3):
        with Image.open(images / f"img{k}.png") as image:
            alone = tl.trace(model, image.convert("RGB"))["vit.layers.0"].out[0]
        assert torch.allclose(rec["vit.layers.0"][k], alone.mean(0), atol=1e-5)
