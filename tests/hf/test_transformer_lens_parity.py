"""TorchLens's transformer names and residual algebra against TransformerLens 4.3's
``TransformerBridge`` on the same GPT-2 weights (saved and booted offline): every name the
bridge caches that TorchLens resolves is equal, and the ActivationCache's algebra is equal."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl

from .conftest import bpe_tokenizer

ATOL = 1e-5


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = bpe_tokenizer(pad=False, wrap=False)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(
            vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=3, n_head=4,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)).eval()
        for module in model.modules():  # norms that are not the identity at init
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.data.uniform_(0.5, 1.5)
                module.bias.data.uniform_(-0.2, 0.2)
    folder = tmp_path_factory.mktemp("tl_parity")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu")
    ids = torch.randint(0, len(tok), (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids)
    cache.compute_head_results()
    trace = tl.trace(model, ids, save="all")
    names = ["hook_embed", "hook_pos_embed", "blocks.*.hook_*", "blocks.*.attn.*",
             "blocks.*.mlp.*", "blocks.*.ln1.*", "blocks.*.ln2.*", "ln_final.hook_normalized"]
    named = tl.trace(model, ids, save=names)
    return model, ids, cache, trace, named


def test_every_cached_name_equals_the_bridge(pair):
    _, _, cache, _, named = pair
    view_names = set(named.meta["names"])
    compared = [name for name in cache.keys() if name in view_names]
    assert len(compared) >= 3 * 17, sorted(set(cache.keys()) - view_names)
    for name in compared:
        ours, theirs = named[name].out, cache[name]
        assert ours.shape == theirs.shape, (name, ours.shape, theirs.shape)
        if name.endswith("hook_attn_scores"):  # masked: -inf here, the dtype's min there
            masked = torch.isinf(ours)
            assert masked.any() and (theirs[masked] <= torch.finfo(theirs.dtype).min / 2).all()
            ours, theirs = ours[~masked], theirs[~masked]
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0, msg=name)


def test_the_residual_algebra_equals_the_activation_cache(pair):
    model, ids, cache, trace, _ = pair
    view = tl.transformer(trace)
    for kwargs in ({}, {"incl_mid": True}, {"layer": 2}, {"apply_ln": True},
                   {"pos_slice": -1, "apply_ln": True}):
        ours, our_labels = view.accumulated_resid(return_labels=True, **kwargs)
        theirs, their_labels = cache.accumulated_resid(return_labels=True, **kwargs)
        assert our_labels == their_labels, kwargs
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0, msg=str(kwargs))
    for kwargs in ({}, {"mode": "attn"}, {"layer": 1}, {"apply_ln": True, "pos_slice": -1}):
        ours, our_labels = view.decompose_resid(return_labels=True, **kwargs)
        theirs, their_labels = cache.decompose_resid(return_labels=True, **kwargs)
        assert our_labels == their_labels, kwargs
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0, msg=str(kwargs))
    ours, our_labels = view.stack_head_results(return_labels=True)
    theirs, their_labels = cache.stack_head_results(return_labels=True)
    assert our_labels == their_labels
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)
    stack = view.accumulated_resid()
    for layer in (None, 1):
        torch.testing.assert_close(view.apply_ln_to_stack(stack, layer=layer),
                                   cache.apply_ln_to_stack(stack, layer=layer), atol=ATOL,
                                   rtol=0)
