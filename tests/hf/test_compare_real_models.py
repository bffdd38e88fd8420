"""tl.compare on real models: GPT-2 in fp32 against bf16, an op-level edit in GPT-2, a
modified resnet18 weight, resnet18 against resnet34, and the diff drawings (issue 48)."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torchvision

import torchlens as tl
from tests.graphs import descendants
from tests.models.hf import seeded_gpt2
from torchlens.cli import main


@pytest.fixture(scope="module")
def gpt2():
    return seeded_gpt2(n_layer=2, n_head=2, tokens=8)



def test_gpt2_fp32_against_bf16_diverges_first_at_an_op_not_the_output(gpt2):
    model, ids = gpt2
    half = copy.deepcopy(model).to(torch.bfloat16)
    cmp = tl.compare(model, half, ids)
    first = cmp.first_divergence()
    assert first is not None and first.func != "output" and first.status == "changed"
    assert first.changes == ["dtype float32 → bfloat16"]
    # it introduced the difference: every input it reads agrees (the token ids)
    parents = [cmp._by_a[p] for p in cmp.a[first.a].parents]
    assert parents and all(not p.differs for p in parents)
    assert first.func == "embedding" and first.module == "transformer.wte"
    assert first.relative < 1e-2 and first.cosine > 0.9999  # bf16 rounding, not a bug
    assert len(cmp.differing()) > 50  # everything after it inherits the rounding
    params = {row["module"]: row["status"] for row in cmp.params}
    assert params["transformer.wte"] == "differ"


def test_an_edit_on_a_residual_add_of_gpt2_is_found_exactly_there(gpt2):
    model, ids = gpt2
    a = tl.trace(model, ids)
    add = next(op.label for op in a if op.func == "add" and op.module == "transformer.h.1")
    b = tl.trace(model, ids, edits={add: tl.edits.zero(index=(slice(None), 3))})
    cmp = tl.compare(a, b)
    assert cmp.first_divergence().label == add
    differing = {r.label for r in cmp.differing()}
    assert add in differing and differing <= {add} | descendants(a, add)
    assert cmp.b[add].out[:, 3].abs().max() == 0
    upstream = [r for r in cmp.rows if r.b is not None and cmp.b[r.b].index < cmp.b[add].index]
    assert upstream and not any(r.differs for r in upstream)


def test_resnet18_with_one_weight_changed_diverges_at_that_conv():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.layer2[0].conv1.weight.mul_(1.001)
    x = torch.randn(1, 3, 64, 64)
    cmp = tl.compare(model, other, x)
    first = cmp.first_divergence()
    assert first.func == "conv2d" and first.module == "layer2.0.conv1"
    assert {r["module"] for r in cmp.params if r["status"] != "equal"} == {"layer2.0.conv1"}
    before = [r for r in cmp.rows if cmp.b[r.b].index < cmp.b[first.b].index]
    assert not any(r.differs for r in before)
    frame = cmp.to_pandas()
    assert len(frame) == len(cmp.rows)
    assert set(frame.columns) >= {"a", "b", "status", "max_abs", "relative", "cosine"}


def test_resnet18_against_resnet34_gives_added_blocks_and_a_marked_drawing(tmp_path):
    torch.manual_seed(0)
    r18 = torchvision.models.resnet18(weights=None).eval()
    r34 = torchvision.models.resnet34(weights=None).eval()
    cmp = tl.compare(r18, r34, torch.randn(1, 3, 64, 64), save=None)
    added = [r for r in cmp.rows if r.status == "added"]
    blocks = {r.module.rsplit(".", 1)[0] if r.module.count(".") > 1 else r.module
              for r in added}
    assert {"layer1.2", "layer2.2", "layer2.3", "layer3.5", "layer4.2"} <= blocks
    assert not [r for r in cmp.rows if r.status == "removed"]
    assert "values: not saved on both sides" in str(cmp)
    cmp.draw(path=tmp_path / "arch.svg", collapse=1)
    svg = (tmp_path / "arch.svg").read_text()
    assert "Diff model_a (ResNet) vs model_b (ResNet)" in svg
    assert re.search(r"layer3.*?28 added", svg, flags=re.S)  # 4 more BasicBlocks of 7 ops
    cmp.draw(path=tmp_path / "ops.svg")
    ops = (tmp_path / "ops.svg").read_text()
    assert ops.count("ADDED: only in model_b") == len(added)
    assert ops.count('stroke="#1a7f37"') == len(added)  # a green border on each added op


def test_the_static_diff_colours_by_difference(gpt2, tmp_path):
    model, ids = gpt2
    a = tl.trace(model, ids)
    b = tl.trace(model, ids, edits={"transformer.h.1.mlp": tl.edits.scale(1.1)})
    tl.compare(a, b).draw(path=tmp_path / "diff.svg")
    svg = (tmp_path / "diff.svg").read_text()
    nodes = re.findall(r'<g id="node\d+" class="node">(.*?)</g>', svg, flags=re.S)
    fills = [re.search(r'fill="(#[0-9a-f]{6})"', g).group(1) for g in nodes]
    differing = [g for g in nodes if "Δ rel" in g]
    assert len(differing) == 7  # dropout_5 and what follows it
    plain = {f for f, g in zip(fills, nodes) if "equal" in g and "Δ" not in g}
    ramp = {f for f, g in zip(fills, nodes) if "Δ rel" in g}
    assert len(ramp) > 2 and not ramp & plain  # the ramp spans the differences
    assert "largest Δ rel 0.1 at dropout_5" in svg and svg.count("equal") > 50


def test_the_cli_writes_the_diff_viewer(gpt2, tmp_path, capsys):
    model, ids = gpt2
    tl.trace(model, ids).save(tmp_path / "a.tlt")
    tl.trace(model, ids, edits={"transformer.h.0": tl.edits.zero()}).save(tmp_path / "b.tlt")
    code = main(["diff", str(tmp_path / "a.tlt"), str(tmp_path / "b.tlt"), "-o",
                 str(tmp_path / "diff.html")])
    out = capsys.readouterr().out
    assert code == 0 and "first divergence: " in out and f"wrote {tmp_path / 'diff.html'}" in out
    page = (tmp_path / "diff.html").read_text()
    assert '"diff":{"a":"a","b":"b"' in page and '"dinfo":[' in page
