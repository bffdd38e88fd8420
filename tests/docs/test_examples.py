"""Every Python block of the README and of the documentation site runs as written, page by
page (the blocks of a page share one scope, in a fresh folder); a few pages also check what
their examples claim."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from .examples import ROOT, blocks, pages, run_page


def _name(page) -> str:
    return str(page.relative_to(ROOT))


PAGES = [p for p in pages() if blocks(p)]


def check_edits(scope, out, folder):
    steered, patched, clean = scope["steered"], scope["patched"], scope["clean"]
    assert len(steered.edits) == 4 and all(row["fired"] for row in steered.edits)
    assert "transformer.h.*" in out and "Patching sweep: 4 sites x 12 positions" in out
    assert patched.edits[0]["index"] == "[:, 4]" and clean.edits == []
    for name in ("ablated", "resid", "mean_ablated", "pushed"):
        assert scope[name].edited and scope[name].edits[0]["norm"] > 0
    assert (folder / "grid.html").exists()
    label = steered.edits[0]["label"]
    assert f"<Op {label}: add -> 1×12×64 float32 in transformer.h.0, EDITED: add" in out
    grid = scope["grid"]
    assert str(grid) in out and grid.decimals == 4  # the metrics lie 0.0124 apart
    page = (folder / "grid.html").read_text()
    assert "<svg class='legend'" in page and "clean</text>" in page


def check_gradients(scope, out, folder):
    assert scope["per_position"].shape == (1, 12)
    assert scope["blocked"].edits[0]["kind"] == "zero (grad)"
    assert scope["attributions"].shape == (1, 12, 64) and abs(float(scope["delta"])) < 0.1
    assert scope["estimate"].values.shape == (4, 12)
    assert torch.all(scope["estimate"].values[:, :4] == 0)  # causal: nothing before position 4
    assert "grad norm" in out and "Attribution patching" in out and "Grad norm" in out
    assert (folder / "grads.html").exists()


def check_generation(scope, out, folder):
    run, gen = scope["run"], scope["gen"]
    assert len(run) == 6 and run.captured == [0, 2, 4]
    assert scope["states"].shape == (3, 2, 5)
    assert len(gen) == 6 and len(gen.tokens) == 6
    assert sorted({row["step"] for row in gen.edits}) == [1, 2]
    assert str(gen.edits) in out and str(gen.edits).startswith("step  site ")
    assert all(row["label"] for row in gen.edits)
    assert "Steps of GRUCell: 6 call(s), 3 captured, 1 distinct graph(s)" in out
    assert (folder / "gen.html").exists()


def check_compare(scope, out, folder):
    first, changed = scope["first"], scope["what_changed"]
    assert first.func == "embedding" and first.status == "changed"
    assert changed.first_divergence().module == "transformer.h.1.mlp.dropout"
    assert "Comparison: model_a (GPT2LMHeadModel) vs model_b (GPT2LMHeadModel)" in out
    assert "first divergence: embedding_1 in transformer.wte" in out
    top = scope["cmp"].top(3)
    assert str(top) in out and str(top).startswith("label  function  module")
    assert (folder / "diff.html").exists()


def check_transformer(scope, out, folder):
    row = scope["row"]
    assert row["site"] == "blocks.2.attn.hook_z" and row["label"].startswith(
        "scaled_dot_product_attention") and row["index"] == "[:, :, [1, 3]]"
    assert scope["blind"].edits[0]["label"].startswith("scaled_dot_product_attention")
    assert "1×10×4×16" in out and "1×4×10×10" in out
    assert list(scope["labels"]) == ["embed", "pos_embed"] + [
        f"{layer}_{kind}_out" for layer in range(4) for kind in ("attn", "mlp")]
    assert scope["head_labels"][:2] == ["L0H0", "L0H1"] and scope["heads"].shape[0] == 16
    assert (folder / "logit_lens.html").exists()
    assert scope["patched"].edits[0]["norm"] > 0


def check_across_processes(scope, out, folder):
    assert "1  linear_1      linear      up       4×32 Shard(dim=1)" in out
    assert "relu_1: (4, 32) whole; (4, 16) (Shard(dim=1),) on this rank" in out
    assert "edited like the unsharded model: True" in out
    assert "FSDP2: ['input_1', 'linear_1', 'relu_1', 'linear_2', 'output_1'] relu_1 grad (4, 32)" \
        in out
    assert type(scope["loaded"]["relu_1"].out) is torch.Tensor
    assert scope["loaded"]["relu_1"].meta["sharded"]["local_shape"] == [4, 16]
    assert "torch.Size([12, 32]) 1 12 [2, 1]" in out  # one store each, rows whole


CHECKS = {
    "docs/guides/edits.md": check_edits,
    "docs/guides/gradients.md": check_gradients,
    "docs/guides/generation.md": check_generation,
    "docs/guides/compare.md": check_compare,
    "docs/guides/transformer.md": check_transformer,
    "docs/guides/across-processes.md": check_across_processes,
}


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_example_of_the_page_runs(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # the pages' shell commands (``torchlens ...``) are this environment's, as under hatch run
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    state = torch.random.get_rng_state()
    try:
        scope = run_page(page)
    finally:
        torch.random.set_rng_state(state)
    check = CHECKS.get(_name(page))
    if check is not None:
        check(scope, capsys.readouterr().out, tmp_path)


def test_the_checked_pages_exist_and_blocks_not_run_say_why():
    names = {_name(p) for p in PAGES}
    assert set(CHECKS) <= names
    skipped = [b for p in pages() for b in blocks(p) if b.not_run is not None]
    assert all(len(b.not_run.split()) >= 3 for b in skipped), skipped
