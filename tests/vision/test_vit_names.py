"""TransformerLens's names on a timm Vision Transformer built from a config (issue 58): every
resolved name equals a forward hook on its module or a hand computation from them, with
torchlens-vision's hints (head count, the patch embedding, the head); a name the ViT lacks
refuses typed, saying why."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl

ATOL = 1e-5


@pytest.fixture(scope="module")
def vit():
    from timm.models.vision_transformer import VisionTransformer
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=3,
                                  num_heads=4, num_classes=10).eval()
    return model, torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _hooked(model, x) -> dict[str, torch.Tensor]:
    """What forward hooks see: each module's input and output."""
    seen: dict[str, torch.Tensor] = {}
    handles = []
    for address, module in model.named_modules():
        def hook(m, args, out, address=address):
            seen[address + ".in"] = args[0].detach().clone() if args else None
            seen[address] = out.detach().clone() if isinstance(out, torch.Tensor) else None
        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    return seen


def test_vit_names_equal_hooks_and_hand_computations(vit):
    model, x = vit
    seen = _hooked(model, x)
    attn = model.blocks[1].attn
    heads, d_head = attn.num_heads, attn.head_dim
    qkv = seen["blocks.1.attn.qkv"].reshape(2, -1, 3, heads, d_head)  # [batch, pos, 3, head, d]
    q, k, v = qkv.unbind(2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * attn.scale
    pattern = scores.softmax(-1)
    want = {
        "hook_embed": seen["patch_embed"],
        "blocks.0.hook_resid_pre": seen["blocks.0.in"],
        "blocks.2.hook_resid_post": seen["blocks.2"],
        "blocks.1.hook_resid_mid": seen["blocks.1.in"] + seen["blocks.1.ls1"],
        "blocks.1.hook_attn_out": seen["blocks.1.attn"],
        "blocks.1.hook_mlp_out": seen["blocks.1.mlp"],
        "blocks.1.ln1.hook_normalized": seen["blocks.1.norm1"],
        "blocks.1.ln2.hook_normalized": seen["blocks.1.norm2"],
        "blocks.1.mlp.hook_post": seen["blocks.1.mlp.act"],
        "blocks.1.attn.hook_q": q, "blocks.1.attn.hook_k": k, "blocks.1.attn.hook_v": v,
        "blocks.1.attn.hook_attn_scores": scores, "blocks.1.attn.hook_pattern": pattern,
        "blocks.1.attn.hook_z": torch.einsum("bhqk,bkhd->bqhd", pattern, v),
        "ln_final.hook_normalized": seen["norm"],
    }
    trace = tl.trace(model, x, save=list(want))
    for name, value in want.items():
        got = trace[name].out
        assert got.shape == value.shape and torch.allclose(got, value, atol=ATOL), name


def test_vit_hints_and_what_it_lacks(vit):
    model, x = vit
    from torchlens.anatomy.bind import hints

    said = hints(model)
    assert said["n_heads"] == [4] and said["embed"] == ["patch_embed"]
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, save=["hook_pos_embed"])
    assert err.value.code == "site_not_in_architecture" and "'pos_embed'" in str(err.value)
    zeroed = tl.trace(model, x, save=["blocks.2.hook_resid_post"],
                      edits={"blocks.0.attn.hook_z": tl.edits.zero(head=[0, 1, 2, 3])})
    plain = tl.trace(model, x, save=["blocks.2.hook_resid_post"])
    assert zeroed.edits[0]["fired"] and not torch.allclose(
        zeroed["blocks.2.hook_resid_post"].out, plain["blocks.2.hook_resid_post"].out)
