"""A transformers model's anatomy from its config: hints for TorchLens's transformer names.

The config says how many heads (and kv heads) the attention has, their width, whether the
residual is parallel and positions rotary, whether attention logits are soft-capped (which a
fused attention call cannot express), and which modules embed tokens and positions and
unembed. The op graph decides: TorchLens refuses when a hint disagrees with it.
"""

from __future__ import annotations

from typing import Any

from torch import nn

POSITIONS = ("wpe", "position_embeddings", "embed_positions", "position_embedding")


def _first(config: Any, *keys: str) -> Any:
    for key in keys:
        value = getattr(config, key, None)
        if value is not None:
            return value
    return None


def _address(model: nn.Module, module: Any) -> str | None:
    if module is None:
        return None
    return next((name for name, m in model.named_modules() if m is module), None)


def hints(model: nn.Module) -> dict[str, Any] | None:
    """The hints a transformers model's config gives, or None for other models."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    config = getattr(config, "text_config", None) or config
    heads = _first(config, "num_attention_heads", "n_head", "num_heads")
    hidden = _first(config, "hidden_size", "n_embd", "d_model")
    d_head = _first(config, "head_dim")
    if d_head is None and heads and hidden:
        d_head = hidden // heads
    out: dict[str, Any] = {
        "n_heads": heads,
        "n_kv_heads": _first(config, "num_key_value_heads") or heads,
        "d_head": d_head,
        "parallel_residual": _first(config, "use_parallel_residual", "parallel_attn"),
        "rotary": _first(config, "rope_theta", "rotary_emb_base", "rope_parameters") is not None,
        "attn_logit_softcapping": _first(config, "attn_logit_softcapping"),
    }
    positions = [name for name, m in model.named_modules()
                 if isinstance(m, nn.Embedding) and name.rpartition(".")[2] in POSITIONS]
    if len(positions) == 1:  # a learned position embedding (the graph alone may not tell it)
        out["pos_embed"] = positions[0]
    else:  # learned positions kept as a parameter (a ViT's), which no op makes
        params = [name for name, _ in model.named_parameters()
                  if name.rpartition(".")[2] in ("position_embeddings", "pos_embed")]
        if len(params) == 1:
            out["pos_embed_param"] = params[0]
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    try:
        out["embed"] = _address(model, get_in() if get_in else None)
        out["unembed"] = _address(model, get_out() if get_out else None)
    except (NotImplementedError, AttributeError):
        pass
    return out
