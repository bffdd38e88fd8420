"""Every surface takes every kind of real input through the one resolver, and obeys the rungs.

Surfaces: tl.trace, tl.summary, tl.draw, trace.run, tl.record, tl.recording.dry_run,
tl.validation.validate_forward_pass / validate_backward_pass. Input kinds: a tensor, a tuple of
positional tensors, a mapping of forward keywords, a prompt string, a PIL image, a modality dict.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.models.zoo import PURE_CASES


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, a, b=None):
        return self.fc(a) + (0 if b is None else self.fc(b))


def _kinds(gpt2, clip, image):
    from torchvision.models import ResNet18_Weights, resnet18

    weights = ResNet18_Weights.IMAGENET1K_V1
    return {
        "tensor": (PURE_CASES["mlp"].build()[0], PURE_CASES["mlp"].build()[1], {}),
        "tuple": (TwoInputs(), (torch.rand(1, 4), torch.rand(1, 4)), {}),
        "mapping": (TwoInputs(), {"a": torch.rand(1, 4), "b": torch.rand(1, 4)}, {}),
        "string": (gpt2.model, "The quick brown fox", {}),
        "image": (resnet18(weights=None).eval(), image.resize((64, 64)),
                  {"preprocess": weights.transforms(resize_size=64, crop_size=56)}),
        "modality dict": (clip.model, {"text": "a photo", "image": image}, {}),
    }


def _first_label(model, x, options):
    return next(op.label for op in tl.trace(model, x, save=None, **options) if op.kind == "op")


SURFACES = {
    "trace": lambda m, x, o, tmp: tl.trace(m, x, **o).provenance,
    "summary": lambda m, x, o, tmp: tl.summary(m, x, **o).provenance,
    "draw": lambda m, x, o, tmp: tl.draw(m, x, path=tmp / "g.dot", **o).provenance,
    "trace.run": lambda m, x, o, tmp: tl.trace(m, x, save=None, **o).run(x, **o).provenance,
    "record": lambda m, x, o, tmp: tl.record(m, x, save=[_first_label(m, x, o)],
                                             progress=False, **o).provenance[0],
    "dry_run": lambda m, x, o, tmp: {"origin": "gold", "rows": tl.recording.dry_run(
        m, x, save=[_first_label(m, x, o)], **o)},
    "validate_forward_pass": lambda m, x, o, tmp: tl.validation.validate_forward_pass(
        m, x, **o).provenance,
    "validate_backward_pass": lambda m, x, o, tmp: tl.validation.validate_backward_pass(
        m, x, **o).provenance,
}
KINDS = ["tensor", "tuple", "mapping", "string", "image", "modality dict"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("surface", list(SURFACES))
def test_every_surface_takes_every_input_kind(surface, kind, gpt2, clip, image, tmp_path):
    model, x, options = _kinds(gpt2, clip, image)[kind]
    reference = tl.trace(model, x, save=None, **options).provenance
    here = SURFACES[surface](model, x, options, tmp_path)
    assert here["origin"] == "gold"
    if "slots" in here:
        assert here["slots"] == reference["slots"]
        assert here.get("resolver") == reference.get("resolver")


SHAPED = {
    "trace": lambda m, **kw: tl.trace(m, torch.rand(1, 4), **kw),
    "summary": lambda m, **kw: tl.summary(m, torch.rand(1, 4), **kw),
    "draw": lambda m, **kw: tl.draw(m, torch.rand(1, 4), **kw),
    "dry_run": lambda m, **kw: tl.recording.dry_run(m, torch.rand(1, 4), save=["linear_1"],
                                                    **kw),
    "validate_forward_pass": lambda m, **kw: tl.validation.validate_forward_pass(
        m, torch.rand(1, 4), **kw),
    "validate_backward_pass": lambda m, **kw: tl.validation.validate_backward_pass(
        m, torch.rand(1, 4), **kw),
}


@pytest.mark.parametrize("surface", list(SHAPED))
def test_every_surface_refuses_mixed_rungs_before_any_forward(surface):
    model = TwoInputs()
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    with pytest.raises(tl.TorchLensError) as err:
        SHAPED[surface](model, input_shape=(1, 4))
    assert err.value.code == "input_rung_conflict" and not calls
