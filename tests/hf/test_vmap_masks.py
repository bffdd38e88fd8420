"""Hugging Face masks built under ``torch.vmap`` (``masking_utils``' or/and mask functions)."""

from __future__ import annotations

import torch
import transformers

import torchlens as tl
from torchlens.validation import validate_forward_pass


def test_gemma3_bidirectional_masks_built_under_vmap_feed_its_attention():
    """Gemma 3 with bidirectional attention (EmbeddingGemma's setting) builds both masks by
    vmapping its mask functions over the query and key positions."""
    torch.manual_seed(0)
    config = transformers.Gemma3TextConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=4,
        use_bidirectional_attention=True)
    model = transformers.Gemma3TextModel(config).eval()
    ids = torch.randint(0, 100, (1, 8))
    trace = tl.trace(model, ids)
    assert torch.equal(trace.output["last_hidden_state"], model(ids).last_hidden_state)
    attention = [op for op in trace if op.func == "scaled_dot_product_attention"]
    assert len(attention) == 2
    for op in attention:
        mask = trace[op.parents[-1]]  # attn_mask: the last op of the vmapped mask function
        assert mask.func == "or" and mask.shape == [8, 8] and mask.dtype == "bool"
        q, kv = torch.arange(8)[:, None], torch.arange(8)[None, :]
        assert torch.equal(mask.out, (q - kv).abs() < config.sliding_window)
    # no op of the mask functions was recorded with one query/key pair's scalar shape
    assert not [op.label for op in trace if op.func in ("le", "gt", "lt", "and", "or")
                and op.shape == []]
    assert validate_forward_pass(model, ids).passed
