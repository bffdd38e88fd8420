"""A timm Vision Transformer's anatomy: hints for TorchLens's transformer names.

timm's ``VisionTransformer`` says its head count and width on each block's attention, embeds
patches with a convolution (``patch_embed``), adds learned positions as a parameter
(``pos_embed``) and classifies with ``head``. The op graph decides: TorchLens refuses when a
hint disagrees with it.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def hints(model: nn.Module) -> dict[str, Any] | None:
    """The hints of a timm ViT (blocks with ``attn.num_heads``, a ``patch_embed``), or None."""
    blocks = getattr(model, "blocks", None)
    attn = getattr(blocks[0], "attn", None) if isinstance(blocks, nn.Sequential) and \
        len(blocks) else None
    if attn is None or not hasattr(attn, "num_heads") or not hasattr(model, "patch_embed") or \
            not type(model).__module__.startswith("timm."):
        return None
    out: dict[str, Any] = {"n_heads": attn.num_heads, "n_kv_heads": attn.num_heads,
                           "d_head": getattr(attn, "head_dim", None), "parallel_residual": False,
                           "rotary": False, "embed": "patch_embed"}
    if isinstance(getattr(model, "pos_embed", None), nn.Parameter):
        out["pos_embed_param"] = "pos_embed"
    if isinstance(getattr(model, "head", None), nn.Linear):
        out["unembed"] = "head"
    return out
