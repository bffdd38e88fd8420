"""The patching grid labels its position axis with the prompt's tokens when a tokenizer is
known (tl.attribution.patching and tl.patching.sweep)."""

from __future__ import annotations

import re

import torch

import torchlens as tl


def test_the_tokens_of_a_tokenized_prompt_label_the_position_axis(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = ["<eos>", "the", "cat", "dog", "sat", "on", "mat"]
    vocab = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    vocab.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=vocab, eos_token="<eos>", unk_token="<eos>")
    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=len(words),
                                    n_positions=16, bos_token_id=0, eos_token_id=0)).eval()
    grid = tl.attribution.patching(lm, "the cat sat on the mat", "the dog sat on the mat",
                                   lambda out: out.logits[0, -1, 2] - out.logits[0, -1, 3],
                                   sites=["transformer.h.*"], tokenizer=tok)
    assert grid.tokens == ["the", "cat", "sat", "on", "the", "mat"]
    grid.save(tmp_path / "grid.html")
    page = (tmp_path / "grid.html").read_text()
    assert re.findall(r"<span class='tok'>([^<]*)</span>", page) == grid.tokens
    ids = tl.attribution.patching(lm, torch.tensor([[1, 2, 4]]), torch.tensor([[1, 3, 4]]),
                                  lambda out: out.logits[0, -1, 2] - out.logits[0, -1, 3],
                                  sites=["transformer.h.*"])
    assert ids.tokens is None  # ids alone: no tokenizer known, positions only
    swept = tl.patching.sweep(lm, "the cat sat on the mat", "the dog sat on the mat",
                              sites=["blocks.*.hook_resid_pre"], tokenizer=tok,
                              metric=lambda out: out.logits[0, -1, 2] - out.logits[0, -1, 3])
    assert swept.tokens == ["the", "cat", "sat", "on", "the", "mat"]
