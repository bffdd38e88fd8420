"""tl.record over prompts to a store: batches tokenized together, padding never stored, the
tokenizer's facts in the manifest, and the command line under torchrun (issue 14)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import torchlens as tl
from tests.hf.conftest import CORPUS
from tests.launch import ROOT, child_env

PROMPTS = CORPUS[:5] + ["Hi.", "A much longer prompt that needs many more tokens than the rest"]


def test_prompts_in_batches_store_each_prompts_real_tokens(bert_base, tmp_path):
    model = bert_base.model
    rec = tl.record(model, PROMPTS, save=["encoder.layer.0"], to=tmp_path, batch_size=3,
                    progress=False)
    view = rec["encoder.layer.0"]
    assert len(rec) == len(PROMPTS) and view.ragged
    for i, prompt in enumerate(PROMPTS):
        alone = tl.trace(model, prompt)["encoder.layer.0"].out[0]
        assert view.row(i).shape == alone.shape  # the prompt's own tokens, no padding
        assert torch.allclose(view.row(i), alone, atol=1e-5)
    n_tokens = sum(len(bert_base.tokenizer(p)["input_ids"]) for p in PROMPTS)
    assert len(view.tokens()) == n_tokens
    facts = rec.provenance["resolver"]["tokenizer"]
    assert rec.provenance["origins"] == {"gold": len(PROMPTS)}
    assert facts["class"] and "vocab_size" in facts


def test_a_real_minilm_reduced_and_cast(minilm, tmp_path):
    rec = tl.record(minilm.model, PROMPTS, save=["encoder.layer.5"], to=tmp_path, batch_size=4,
                    reduce="mean", dtype=torch.bfloat16, progress=False)
    rows = rec["encoder.layer.5"][0:len(PROMPTS)]
    assert rows.shape == (len(PROMPTS), 384) and rows.dtype == torch.bfloat16
    alone = tl.trace(minilm.model, PROMPTS[-1])["encoder.layer.5"].out[0].mean(0)
    assert torch.allclose(rows[-1].float(), alone, atol=2e-2)


def test_prompts_without_a_pad_token_refuse_before_storing(gpt2, tmp_path):
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(gpt2.model, PROMPTS, save=["transformer.h.0"], to=tmp_path / "s",
                  batch_size=4, progress=False)
    assert err.value.code == "tokenizer_padding_unavailable"
    assert not (tmp_path / "s" / "manifest.json").exists()
    rec = tl.record(gpt2.model, PROMPTS[:3], save=["transformer.h.0"], to=tmp_path / "one",
                    progress=False)  # one prompt per forward needs no padding
    assert len(rec) == 3


def test_the_command_line_records_under_torchrun(bert_base, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n\n")
    args = ["record", str(bert_base.path), "--inputs", str(prompts), "--save",
            "encoder.layer.0", "--save", "pooler", "--no-progress"]
    single = [sys.executable, "-m", "torchlens", *args, "--to", str(tmp_path / "one")]
    subprocess.run(single, cwd=ROOT, env=child_env(), check=True, capture_output=True, timeout=120)
    one = tl.recording.open(tmp_path / "one")  # one rank, same threads as each rank below
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "torchlens", *args, "--to", str(tmp_path / "two")]
    done = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("Recording store") == 1  # rank 0 alone reports
    two = tl.recording.open(tmp_path / "two")
    assert two.manifest["world_size"] == 2 and len(two) == len(one) == len(PROMPTS)
    for i in range(len(PROMPTS)):
        assert torch.equal(one["encoder.layer.0"].row(i), two["encoder.layer.0"].row(i))
    assert torch.equal(one["pooler"][0:len(one)], two["pooler"][0:len(two)])
