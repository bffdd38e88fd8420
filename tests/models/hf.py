"""Tiny Hugging Face models for the TorchLens test zoo.

Built from configs with random init: no hub access, no downloads. transformers is imported
lazily inside each ``build``. Example inputs are dicts of forward kwargs.
"""

from __future__ import annotations

import torch
from torch import nn

from .zoo import ZooCase, seeded

__all__ = ["HF_CASES", "build_bert_tiny", "build_gpt2_tiny", "seeded_gpt2"]

_VOCAB = 100
_SEQ = 8


def seeded_gpt2(n_layer: int, n_head: int, tokens: int) -> tuple[nn.Module, torch.Tensor]:
    """A 64-wide GPT-2 (vocab 500) made under seed 0 without moving the global RNG, and
    ``tokens`` ids from its own seed-0 generator."""
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=500, n_positions=64, n_embd=64,
                                           n_layer=n_layer, n_head=n_head)).eval()
    return model, torch.randint(0, 500, (1, tokens), generator=torch.Generator().manual_seed(0))


def build_gpt2_tiny() -> tuple[nn.Module, object]:
    """Tiny GPT2LMHeadModel (2 layers, 32 wide, 2 heads, vocab 100); lm_head is tied to wte.

    ``use_cache=False`` so the output holds tensors only (no ``DynamicCache`` object).
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    with seeded(200):
        config = GPT2Config(
            n_layer=2,
            n_embd=32,
            n_head=2,
            vocab_size=_VOCAB,
            n_positions=64,
            use_cache=False,
            # GPT-2's default special ids (50256) lie outside the tiny vocab; transformers 5.x
            # warns about that, so use the last id, as GPT-2 does.
            bos_token_id=_VOCAB - 1,
            eos_token_id=_VOCAB - 1,
        )
        model = GPT2LMHeadModel(config)
        inputs = {
            "input_ids": torch.randint(0, _VOCAB, (1, _SEQ)),
            "attention_mask": torch.ones(1, _SEQ, dtype=torch.long),
        }
    return model.eval(), inputs


def build_bert_tiny() -> tuple[nn.Module, object]:
    """Tiny BertModel (hidden 32, 2 layers, 2 heads, intermediate 64, vocab 100)."""
    from transformers import BertConfig, BertModel

    with seeded(201):
        config = BertConfig(
            vocab_size=_VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
        model = BertModel(config)
        inputs = {
            "input_ids": torch.randint(0, _VOCAB, (1, _SEQ)),
            "attention_mask": torch.ones(1, _SEQ, dtype=torch.long),
            "token_type_ids": torch.zeros(1, _SEQ, dtype=torch.long),
        }
    return model.eval(), inputs


_NEEDS = frozenset({"transformers"})

HF_CASES: dict[str, ZooCase] = {
    "gpt2_tiny": ZooCase(
        "gpt2_tiny",
        build_gpt2_tiny,
        needs=_NEEDS,
        # c_fc is a transformers Conv1D: addmm then .view, so its output comes from the view.
        module_outputs=("transformer.h.0.ln_1", "transformer.h.0.mlp.c_fc", "lm_head"),
    ),
    "bert_tiny": ZooCase(
        "bert_tiny",
        build_bert_tiny,
        needs=_NEEDS,
        module_outputs=(
            "embeddings.LayerNorm",
            "encoder.layer.0.attention.self.query",
            "encoder.layer.1.intermediate.dense",
        ),
    ),
}
