"""Per-step memory of a long step run (issue 61 §4), measured with tracemalloc: a Python loop
over a sliding window and tl.generate with a KV cache each hold at most 16 bytes per op per
step beyond saved values, and steps that settle into new shapes share one record of them."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
import torch

import torchlens as tl

BUDGET = 16  # bytes per op per step


@pytest.fixture(scope="module")
def lm():
    from transformers import GPT2Config, GPT2LMHeadModel
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500,
                                          n_positions=512, bos_token_id=1,
                                          eos_token_id=1)).eval()


def window(lm, n: int):
    """A user's loop: the last 8 tokens in, no KV cache; the first steps see 5, 6, 7."""
    ids = torch.randint(2, 500, (1, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), tl.steps(lm) as run:
        for _ in range(n):
            logits = lm(ids[:, -8:], use_cache=False).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], 1)
    return run


def generate(lm, n: int):
    ids = torch.randint(2, 500, (1, 8), generator=torch.Generator().manual_seed(0))
    return tl.generate(lm, ids, max_new_tokens=n, min_new_tokens=n)


def held(make, lm, n: int) -> tuple[int, object]:
    gc.collect()
    tracemalloc.start()
    try:
        run = make(lm, n)
        gc.collect()
        return tracemalloc.get_traced_memory()[0], run
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("make", [window, generate])
def test_a_long_run_holds_at_most_16_bytes_per_op_per_step(lm, make):
    make(lm, 4)  # imports and one-time set-up, outside the figures
    small, run = held(make, lm, 64)
    del run
    large, run = held(make, lm, 192)
    ops = len(run[191].ops)
    per_op = (large - small) / (128 * ops)
    assert len(run) == 192 and run.structures <= 2
    assert 0 < per_op <= BUDGET, f"{per_op:.1f} bytes per op per step"


def test_steps_settled_into_new_shapes_share_one_record_of_them(lm):
    run = window(lm, 12)
    steps = run._steps
    assert run.structures == 1 and steps[1].changed is not None  # 6 tokens: its own shapes
    assert steps[4].changed is steps[11].changed  # 8 tokens from step 3 on: one array
    assert steps[2].changed is not steps[3].changed
    assert run[11].ops[-1].shape == [1, 8, 500] and run[0].ops[-1].shape == [1, 5, 500]
