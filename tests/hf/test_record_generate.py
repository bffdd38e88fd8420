"""tl.record(lm, prompts, generate={...}) (issue 47): a row per token of each generation, the
step and token id beside the labels, against hooks on a plain lm.generate; resume."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl
from tests.hf.hooked import hooked_generate

PROMPTS = ["the quick brown fox", "a lazy dog", "jumps over"]


@pytest.fixture
def lm(generating_gpt2):
    return generating_gpt2


def _hooked(lm, tokenizer, prompt, n):
    out, kept, prompt_len = hooked_generate(lm, tokenizer, prompt, n)
    return torch.cat(kept, dim=1)[0], out[0, :-1], prompt_len


def test_a_generation_is_recorded_a_row_per_token(lm, gpt2, tmp_path):
    rec = tl.record(lm, PROMPTS, generate={"max_new_tokens": 5}, save=["transformer.h.0"],
                    to=tmp_path / "gen", progress=False)
    assert set(rec.labels) >= {"transformer.h.0", "generate.step", "generate.token"}
    for i, prompt in enumerate(PROMPTS):
        values, tokens, prompt_len = _hooked(lm, gpt2.tokenizer, prompt, 5)
        assert torch.allclose(rec["transformer.h.0"].row(i), values, atol=1e-6)
        assert torch.equal(rec["generate.token"].row(i), tokens)  # the last chosen: no row
        assert rec["generate.step"].row(i).tolist() == [0] * prompt_len + [1, 2, 3, 4]
    assert rec.manifest["options"]["generate"] == {"max_new_tokens": 5}


def test_an_interrupted_generation_record_resumes(lm, tmp_path):
    def stops_after_two():
        for k, prompt in enumerate(PROMPTS):
            if k == 2:
                raise KeyboardInterrupt
            yield prompt

    with pytest.raises(KeyboardInterrupt):
        tl.record(lm, stops_after_two(), generate={"max_new_tokens": 3},
                  save=["transformer.h.0"], to=tmp_path / "r", progress=False)
    kept = tl.recording.open(tmp_path / "r")
    assert len(kept["generate.step"]) == 2
    done = tl.record(lm, iter(PROMPTS), generate={"max_new_tokens": 3},
                     save=["transformer.h.0"], to=tmp_path / "r", progress=False)
    whole = tl.record(lm, iter(PROMPTS), generate={"max_new_tokens": 3},
                      save=["transformer.h.0"], to=tmp_path / "w", progress=False)
    for i in range(3):
        assert torch.equal(done["transformer.h.0"].row(i), whole["transformer.h.0"].row(i))
    with pytest.raises(tl.TorchLensError) as err:  # other options: another store
        tl.record(lm, iter(PROMPTS), generate={"max_new_tokens": 4},
                  save=["transformer.h.0"], to=tmp_path / "w", progress=False)
    assert err.value.code == "recording_mismatch"


def test_generate_options_are_checked_before_any_forward(lm, tmp_path):
    for kw in ({"batch_size": 2}, {"reduce": "mean"}):
        with pytest.raises(tl.TorchLensError) as err:
            tl.record(lm, PROMPTS, generate={"max_new_tokens": 3}, save=["transformer.h.0"],
                      progress=False, **kw)
        assert err.value.code == "option_invalid"
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(lm, PROMPTS, generate=16, save=["transformer.h.0"], progress=False)
    assert err.value.code == "option_invalid"


def test_generations_recorded_under_torchrun_equal_one_process(gpt2, tmp_path):
    """The command line's --generate under torchrun with two ranks: the same rows as one
    process, each rank generating its share of the prompts."""
    import subprocess
    import sys

    from tests.launch import ROOT, child_env

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS + ["over the hills"]) + "\n")
    args = ["record", str(gpt2.path), "--inputs", str(prompts), "--save", "transformer.h.0",
            "--generate", "3", "--no-progress"]
    single = [sys.executable, "-m", "torchlens", *args, "--to", str(tmp_path / "one")]
    subprocess.run(single, cwd=ROOT, env=child_env(), check=True, capture_output=True,
                   timeout=180)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "torchlens", *args, "--to", str(tmp_path / "two")]
    done = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = tl.recording.open(tmp_path / "one"), tl.recording.open(tmp_path / "two")
    assert two.manifest["world_size"] == 2 and len(one) == len(two) == 4
    for label in ("transformer.h.0", "generate.step", "generate.token"):
        for i in range(4):
            assert torch.equal(one[label].row(i), two[label].row(i)), (label, i)
    assert one["generate.step"].row(0).max() == 2  # a prefill and two decoding steps
