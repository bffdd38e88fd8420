"""The command line with torchlens-hf: a local model folder and --text."""

from __future__ import annotations

import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "torchlens.cli", *args], capture_output=True,
                          text=True, timeout=180, env={"HF_HUB_OFFLINE": "1", "PATH": ""})


def test_summary_of_a_model_folder_from_text(gpt2):
    out = run("summary", str(gpt2.path), "--text", "the quick brown fox")
    assert out.returncode == 0, out.stderr
    assert "Input: gold (your real input via torchlens-hf)" in out.stdout
    assert "GPT2LMHeadModel summary" in out.stdout


def test_text_and_shape_are_exclusive(gpt2):
    out = run("summary", str(gpt2.path), "--text", "hi", "--input-shape", "1,4")
    assert out.returncode == 2 and "exclusive" in out.stderr


def test_load_model_hook_loads_a_folder_offline(gpt2):
    """torchlens_load_model: the HF plugin loads a local folder with its tokenizer attached."""
    from torchlens.plugins import hook

    model = hook().torchlens_load_model(path=str(gpt2.path), meta=False)
    assert type(model).__name__ == "GPT2LMHeadModel" and not model.training
    assert model.tokenizer is not None
    assert hook().torchlens_load_model(path=str(gpt2.path.parent), meta=False) is None
    empty = hook().torchlens_load_model(path=str(gpt2.path / "config.json"), meta=True)
    assert type(empty).__name__ == "GPT2LMHeadModel" and empty.lm_head.weight.is_meta
