"""tl.generate (issue 47): a greedy GPT-2 generation as one run of steps, against lm.generate
alone and hand-written hooks; edits on chosen steps; the prompt resolved as a gold input."""

from __future__ import annotations

import sys

import pytest
import torch

import torchlens as tl
from tests.hf.hooked import hooked_generate

PROMPT = "the quick brown fox"


@pytest.fixture
def lm(generating_gpt2):
    return generating_gpt2


def _plain(lm, tokenizer, n, hook_site="transformer.h.0"):
    out, kept, prompt_len = hooked_generate(lm, tokenizer, PROMPT, n, hook_site)
    return out[0, prompt_len:].tolist(), kept


def test_greedy_generation_is_lm_generates_and_each_step_what_hooks_see(lm, gpt2):
    tokens, kept = _plain(lm, gpt2.tokenizer, 8)
    run = tl.generate(lm, PROMPT, max_new_tokens=8, save=["transformer.h.0"])
    assert run.tokens == tokens and len(run) == 8 == len(kept)
    assert run.text == gpt2.tokenizer.decode(tokens, skip_special_tokens=True)
    values = run.values("transformer.h.0")  # the prefill has the prompt's length: a list
    assert isinstance(values, list) and len(values) == 8
    assert all(torch.allclose(v, k, atol=1e-6) for v, k in zip(values, kept))
    assert run.structures == 2  # the prefill, and every decoding step after it
    assert all(run.shared(i) == 1 for i in range(2, 8))
    assert run.provenance["origin"] == "gold"
    text = str(run)
    assert f"generated: {run.text!r}" in text and str(tokens[3]) in text.splitlines()[5]
    assert "forward" not in lm.__dict__


@pytest.mark.parametrize("holding", ["held", "checked as they run"])
def test_metadata_only_decoding_steps_follow_and_equal_full_captures(lm, monkeypatch, holding):
    """Every decoding step after the first follows the one before, and each step's Trace is
    what recording that step in full gives (the graph, shapes, FLOPs, module calls): whether
    the steps hold their ops to the end or check each as it runs (a graph above HOLD_BYTES)."""
    from tests.core.test_steps_follow import facts
    from torchlens.steps.run import StepRun

    if holding != "held":
        monkeypatch.setattr(sys.modules["torchlens.steps.run"], "HOLD_BYTES", 0)
    followed = []
    add = StepRun.add_followed
    monkeypatch.setattr(StepRun, "add_followed", lambda run, i, first, kept: (
        followed.append(i), add(run, i, first, kept))[1])
    run = tl.generate(lm, PROMPT, max_new_tokens=6, save=None)
    assert followed == [2, 3, 4, 5] and run.structures == 2
    monkeypatch.setattr(StepRun, "follow", lambda run: None)  # every step recorded in full
    full = tl.generate(lm, PROMPT, max_new_tokens=6, save=None)
    assert run.tokens == full.tokens
    for i in range(6):
        assert facts(run[i]) == facts(full[i]), i
    assert run[5]["cat_1"].shape != run[2]["cat_1"].shape  # the KV cache grew: own shapes


def test_a_llamas_followed_steps_equal_full_captures(monkeypatch):
    """The same on a Llama (grouped-query attention, rotary embeddings) built from a config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.core.test_steps_follow import facts
    from torchlens.steps.run import StepRun

    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, vocab_size=500)).eval()
    ids = torch.randint(0, 500, (1, 7), generator=torch.Generator().manual_seed(0))
    options = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    run = tl.generate(lm, ids, save=None, **options)
    monkeypatch.setattr(StepRun, "follow", lambda run: None)
    full = tl.generate(lm, ids, save=None, **options)
    with torch.no_grad():
        plain = lm.generate(ids, **options)[0, 7:].tolist()
    assert run.tokens == full.tokens == plain and run.structures == 2
    assert all(run.shared(i) == 1 for i in range(2, 8))
    for i in range(8):
        assert facts(run[i]) == facts(full[i]), i


def test_at_steps_captures_only_those_and_the_tokens_stay_the_same(lm, gpt2):
    tokens, _ = _plain(lm, gpt2.tokenizer, 6)
    run = tl.generate(lm, PROMPT, max_new_tokens=6, save=["transformer.h.0"], at_steps=[0])
    assert run.tokens == tokens and run.captured == [0] and len(run) == 6


def test_a_steering_edit_on_chosen_steps_changes_only_those(lm, gpt2):
    tokens, kept = _plain(lm, gpt2.tokenizer, 6, hook_site="transformer.drop")
    steer = 50.0 * torch.randn(32, generator=torch.Generator().manual_seed(3))
    run = tl.generate(lm, PROMPT, max_new_tokens=6, save=["transformer.drop"],
                      edits={"transformer.h.0": tl.edits.add(steer)}, at_steps=[2, 3])
    assert sorted({row["step"] for row in run.edits}) == [2, 3]
    assert run.tokens[:2] == tokens[:2]  # before the first edited step: the same tokens
    assert run.tokens[2] != tokens[2]  # the steered step chose another token
    assert torch.allclose(run[2]["transformer.drop"].out, kept[2], atol=1e-6)  # upstream


def test_save_every_step_edit_only_some_equals_hooks(lm, gpt2):
    """edit_steps= edits steps 2 and 3 while every step is saved (issue 61 §3), as a hook that
    steers only on those calls does."""
    steer = 50.0 * torch.randn(32, generator=torch.Generator().manual_seed(3))
    calls, kept = [0], []

    def steer_hook(module, args, out):
        calls[0] += 1
        if calls[0] - 1 in (2, 3):
            return (out[0] + steer,) + tuple(out[1:]) if isinstance(out, tuple) else out + steer

    def keep_hook(module, args, out):
        kept.append((out[0] if isinstance(out, tuple) else out).detach().clone())

    handles = [lm.transformer.h[0].register_forward_hook(steer_hook),
               lm.transformer.ln_f.register_forward_hook(keep_hook)]
    ids = gpt2.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    try:
        want = lm.generate(ids, max_new_tokens=6, do_sample=False,
                           pad_token_id=gpt2.tokenizer.eos_token_id)[0, ids.shape[1]:].tolist()
    finally:
        for handle in handles:
            handle.remove()
    run = tl.generate(lm, PROMPT, max_new_tokens=6, save=["transformer.ln_f"],
                      edits={"transformer.h.0": tl.edits.add(steer)}, edit_steps=[2, 3])
    assert run.tokens == want and run.captured == list(range(6))
    assert sorted({row["step"] for row in run.edits}) == [2, 3]
    values = run.values("transformer.ln_f")
    assert all(torch.allclose(v, k, atol=1e-5) for v, k in zip(values, kept))
    with pytest.raises(tl.TorchLensError) as err:
        tl.generate(lm, PROMPT, max_new_tokens=3, edits={"transformer.h.0": tl.edits.zero()},
                    edit_steps=[5])
    assert err.value.code == "steps_not_reached" and "edit_steps=[]" not in str(err.value.teach)
    with pytest.raises(tl.TorchLensError) as err:
        with tl.steps(lm, save=["transformer.ln_f"], edit_steps=[0]):
            pass
    assert err.value.code == "option_invalid" and "edits=" in err.value.teach[0]


def test_transformer_names_in_a_generation_equal_hooks(lm, gpt2):
    """Names are bound at each step to its own input (issue 58): a head of hook_z zeroed on
    steps 1-2 is a pre-hook zeroing that head's columns of c_proj's input on those calls."""
    heads, d_head = lm.config.n_head, lm.config.n_embd // lm.config.n_head
    calls, kept = [0], []

    def zero_head(module, args):
        calls[0] += 1
        if calls[0] - 1 in (1, 2):
            x = args[0].clone()
            x[..., d_head:2 * d_head] = 0
            return (x,)

    handles = [lm.transformer.h[0].attn.c_proj.register_forward_pre_hook(zero_head),
               lm.transformer.h[0].register_forward_hook(
                   lambda m, a, o: kept.append((o[0] if isinstance(o, tuple) else o).clone()))]
    ids = gpt2.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    try:
        want = lm.generate(ids, max_new_tokens=4, do_sample=False,
                           pad_token_id=gpt2.tokenizer.eos_token_id)[0, ids.shape[1]:].tolist()
    finally:
        for handle in handles:
            handle.remove()
    run = tl.generate(lm, PROMPT, max_new_tokens=4,
                      save=["blocks.0.hook_resid_post", "blocks.0.attn.hook_pattern"],
                      edits={"blocks.0.attn.hook_z": tl.edits.zero(head=1)}, edit_steps=[1, 2])
    assert run.tokens == want
    assert sorted({row["step"] for row in run.edits}) == [1, 2]
    for i in range(4):
        step = run[i]
        assert torch.allclose(step["blocks.0.hook_resid_post"].out, kept[i], atol=1e-5)
        pattern = step["blocks.0.attn.hook_pattern"].out
        assert pattern.shape[1] == heads and torch.allclose(pattern.sum(-1),
                                                            torch.ones(()), atol=1e-5)


def test_tl_generate_is_the_loop_torchlens_hf_provides():
    from torchlens.plugins import hook
    from torchlens_hf.generation import generate

    assert hook().torchlens_generate() is generate


def test_tl_generate_needs_torchlens_hf(monkeypatch):
    from types import SimpleNamespace

    import torchlens.verbs

    monkeypatch.setattr(torchlens.verbs, "hook",
                        lambda: SimpleNamespace(torchlens_generate=lambda: None))
    calls = []
    model = torch.nn.Linear(2, 2)
    model.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(tl.TorchLensError) as err:
        tl.generate(model, "hello")
    assert err.value.code == "dependency_missing" and "pip install torchlens-hf" in \
        err.value.teach
    assert not calls  # refused before any forward
