"""tl.summary shows everything torchinfo 1.8.0 shows, side by side on resnet18 and GPT-2."""

from __future__ import annotations

import pytest
import torchinfo

import torchlens as tl
from tests.models import CASES


@pytest.mark.parametrize("name", ["resnet18", "gpt2_tiny"])
def test_everything_torchinfo_shows_is_present(name):
    model, x = CASES[name].build()
    ours = tl.summary(model, x, depth=3)
    theirs = torchinfo.summary(model, input_data=x, depth=3, verbose=0)
    t = ours.totals
    unique = sum(p.numel() for p in model.parameters())
    assert t["total_params"] == unique
    # torchinfo counts a tied weight once per module that holds it; TorchLens counts it once
    assert theirs.total_params >= unique
    assert t["trainable_params"] == sum(p.numel() for p in model.parameters() if
                                        p.requires_grad)
    assert t["input_bytes"] == sum(v.numel() * v.element_size() for v in
                                   (x.values() if isinstance(x, dict) else [x]))
    assert t["param_bytes"] == sum(p.numel() * p.element_size() for p in model.parameters())
    # every module row torchinfo lists (type + depth) has a row in ours, in the same order
    theirs_rows = [(layer.class_name, layer.depth) for layer in theirs.summary_list
                   if 0 < layer.depth <= 3]
    ours_rows = [(r["type"], r["depth"]) for r in ours.rows]
    it = iter(ours_rows)
    assert all(row in it for row in theirs_rows)
    text = str(ours)
    for needle in ("Output shape", "Params", "Total params", "Trainable params",
                   "Non-trainable params", "Mult-adds", "Input size", "Params size",
                   "Estimated total size"):
        assert needle in text


def test_resnet18_mult_adds_match_torchinfo():
    model, x = CASES["resnet18"].build()
    ours = tl.summary(model, x)
    theirs = torchinfo.summary(model, input_data=x, verbose=0)
    # torchinfo also counts BatchNorm's affine mult-adds; conv + linear agree to 0.01%
    assert abs(ours.totals["macs"] - theirs.total_mult_adds) / theirs.total_mult_adds < 1e-4
