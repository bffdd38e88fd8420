"""TorchLens's transformer names and residual algebra against TransformerLens 4.3's
``TransformerBridge`` on the same GPT-2 weights (saved and booted offline): every name the
bridge caches that TorchLens resolves is equal, and the ActivationCache's algebra is equal,
``logit_attrs`` included (the bridge dots with its ``W_U`` as it is, so it is the same number
where the final norm's weight is one or folded into ``W_U``, as compatibility mode does)."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl

from .conftest import bpe_tokenizer

ATOL = 1e-5


def _gpt2(folder, unit_final: bool = False):
    """A 3-layer GPT-2 with norms that are not the identity (``unit_final``: but the final
    one), saved with its tokenizer into ``folder``; its ids."""
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
    if unit_final:
        model.transformer.ln_f.weight.data.fill_(1.0)
        model.transformer.ln_f.bias.data.zero_()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    ids = torch.randint(0, len(tok), (2, 9), generator=torch.Generator().manual_seed(5))
    return model, ids


def _boot(folder, compatible: bool = False):
    """The bridge on the saved model (``compatible``: TransformerLens's compatibility mode,
    which folds the norms' weights into the next weights, the final one into ``W_U``), and its
    cache of a run."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu")
    if compatible:
        bridge.enable_compatibility_mode()
    return bridge


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tl_parity")
    model, ids = _gpt2(folder)
    bridge = _boot(folder)
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids)
    cache.compute_head_results()
    trace = tl.trace(model, ids, save="all")
    names = ["hook_embed", "hook_pos_embed", "blocks.*.hook_*", "blocks.*.attn.*",
             "blocks.*.mlp.*", "blocks.*.ln1.*", "blocks.*.ln2.*", "ln_final.hook_normalized"]
    named = tl.trace(model, ids, save=names)
    return model, ids, cache, trace, named, folder


def test_every_cached_name_equals_the_bridge(pair):
    _, _, cache, _, named, _ = pair
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
    model, ids, cache, trace, _, _ = pair
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


def _attr_cases(view, cache, ids):
    """(what, our attributions, the bridge's) for the stacks and token shapes
    ``logit_attrs`` takes: the last position's stacks with a token per row (and a logit
    difference against another), the whole stacks with a token per position."""
    right, wrong = ids[:, -1], ids[:, 0]
    for what, ours, theirs in (
            ("accumulated_resid", view.accumulated_resid(pos_slice=-1, incl_mid=True),
             cache.accumulated_resid(pos_slice=-1, incl_mid=True)),
            ("decompose_resid", view.decompose_resid(pos_slice=-1),
             cache.decompose_resid(pos_slice=-1)),
            ("stack_head_results", view.stack_head_results(pos_slice=-1),
             cache.stack_head_results(layer=-1, pos_slice=-1))):
        yield what, view.logit_attrs(ours, right, pos_slice=-1), \
            cache.logit_attrs(theirs, right, pos_slice=-1)
        yield what + " diff", view.logit_attrs(ours, right, incorrect_tokens=wrong, pos_slice=-1), \
            cache.logit_attrs(theirs, right, incorrect_tokens=wrong, pos_slice=-1)
    yield "decompose_resid [batch, pos]", view.logit_attrs(view.decompose_resid(), ids), \
        cache.logit_attrs(cache.decompose_resid(), ids)


def test_logit_attrs_equal_the_bridges_where_the_final_norm_is_the_identity(tmp_path):
    model, ids = _gpt2(tmp_path, unit_final=True)
    with torch.no_grad():
        _, cache = _boot(tmp_path).run_with_cache(ids)
    cache.compute_head_results()
    view = tl.transformer(tl.trace(model, ids, save="all"))
    for what, ours, theirs in _attr_cases(view, cache, ids):
        assert ours.shape == theirs.shape, what
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0, msg=what)


def test_logit_attrs_fold_the_final_norm_weight_and_add_up_to_the_logit(pair):
    model, ids, cache, trace, _, folder = pair
    view = tl.transformer(trace)
    right, wrong = ids[:, -1], ids[:, 0]
    rows = torch.arange(ids.shape[0])
    logits = trace.output["logits"][:, -1]
    diff = logits[rows, right] - logits[rows, wrong]
    w_u, bias = model.lm_head.weight.detach(), model.transformer.ln_f.bias.detach()
    bias_term = (w_u[right] - w_u[wrong]) @ bias
    stack = view.decompose_resid(pos_slice=-1)  # every writer of the final stream
    ours = view.logit_attrs(stack, right, incorrect_tokens=wrong, pos_slice=-1)
    torch.testing.assert_close(ours.sum(0) + bias_term, diff, atol=ATOL, rtol=0)
    # the bridge dots with the unembedding as it is: without the final norm's weight its
    # attributions do not add up to the logit difference
    theirs = cache.logit_attrs(cache.decompose_resid(pos_slice=-1), right,
                               incorrect_tokens=wrong, pos_slice=-1)
    assert (theirs.sum(0) + bias_term - diff).abs().max() > 1e-3
    # folded into W_U (compatibility mode), the bridge's attributions of the stream are ours
    folded = _boot(folder, compatible=True)
    with torch.no_grad():
        _, cache = folded.run_with_cache(ids)
    for kwargs in ({"pos_slice": -1}, {"pos_slice": -1, "incl_mid": True}):
        ours = view.logit_attrs(view.accumulated_resid(**kwargs), right, incorrect_tokens=wrong,
                                pos_slice=-1)
        theirs = cache.logit_attrs(cache.accumulated_resid(**kwargs), right,
                                   incorrect_tokens=wrong, pos_slice=-1)
        torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0, msg=str(kwargs))
