"""compile= on real transformers from configs (issue 59): TransformerLens's names, patterns
through fused attention, module sites and head edits recorded and traced through
torch.compile, equal to the eager capture; the store's manifest says how it compiled."""

from __future__ import annotations

import json

import torch

import torchlens as tl
from tests.hf.test_transformer_names import _gpt2, _llama

SAVE = ["blocks.1.hook_resid_mid", "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_z",
        "blocks.*.hook_resid_post"]


def _close(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


def test_record_names_compiled_equal_eager_gpt2(tmp_path):
    model, ids = _gpt2()
    data = [ids, ids.flip(1), ids.roll(1, 1)]
    edits = {"scaled_dot_product_attention_2": tl.edits.zero(index=(slice(None), 1))}
    eager = tl.record(model, data, save=SAVE + ["transformer.h.0"], edits=edits)
    compiled = tl.record(model, data, save=SAVE + ["transformer.h.0"], edits=edits,
                         to=tmp_path / "store", compile=True)
    assert sorted(compiled.manifest["labels"]) == sorted(eager.labels)
    for name in eager.labels:
        rows = compiled[name][:]  # the store's rows, a tensor or (ragged) a list
        got = torch.cat([r.reshape(-1) for r in rows]) if isinstance(rows, list) else rows
        assert _close(eager[name].reshape(-1), got.reshape(-1)) < 1e-5, name
    facts = json.loads((tmp_path / "store" / "manifest.json").read_text())["compiled"]
    assert facts["graph_breaks"] == 0 and facts["recompiles"] == 0
    assert set(facts["max_abs_diff"]) >= {"transformer.h.0"}


def test_trace_names_and_head_edit_compiled_equal_eager_llama():
    model, ids = _llama()  # grouped-query attention, rotary, SDPA
    save = ["blocks.0.attn.hook_pattern", "blocks.1.hook_resid_post", "blocks.1.attn.hook_k",
            "model.layers.0.mlp"]
    edits = {"blocks.0.attn.hook_z": tl.edits.zero(head=[1, 3])}
    eager = tl.trace(model, ids, save=save, edits=edits)
    compiled = tl.trace(model, ids, save=save, edits=edits, compile=True)
    for name in save:
        assert _close(eager[name].out, compiled[name].out) < 1e-5, name
    assert compiled.edits[0]["label"] == eager.edits[0]["label"]
    assert compiled.meta["compiled"]["graph_breaks"] == 0
    plain = tl.trace(model, ids, save=["blocks.1.hook_resid_post"])
    assert _close(plain["blocks.1.hook_resid_post"].out,
                  compiled["blocks.1.hook_resid_post"].out) > 1e-4  # the head edit ran
