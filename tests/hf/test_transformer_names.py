"""TransformerLens's names as sites, resolved from the op graph: every name equals a forward
hook or a hand computation on real transformers built from configs, fused attention's patterns
equal the eager implementation's, edits of a name edit the real tensor, and a name an
architecture lacks refuses typed before the capture."""

from __future__ import annotations

import copy

import pytest
import torch

import torchlens as tl
from torchlens.errors import TorchLensError

ATOL = 1e-6


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2,
                                           n_head=4, bos_token_id=99, eos_token_id=99)).eval()
    return model, torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(1))


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            bos_token_id=1, eos_token_id=2, pad_token_id=0)).eval()
    return model, torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(2))


def _eager(model):
    twin = copy.deepcopy(model)
    twin.config._attn_implementation = "eager"
    for module in twin.modules():
        if hasattr(module, "config"):
            module.config._attn_implementation = "eager"
    return twin


class Hooks:
    """Forward hooks writing each module's input and output down."""

    def __init__(self, model, addresses):
        self.inputs, self.outputs, self.handles = {}, {}, []
        modules = dict(model.named_modules())
        for address in addresses:
            self.handles.append(modules[address].register_forward_hook(
                self._keep(address), with_kwargs=True))

    def _keep(self, address):
        def hook(module, args, kwargs, output):
            first = args[0] if args else next(iter(kwargs.values()))
            self.inputs[address] = first.detach().clone()
            out = output[0] if isinstance(output, tuple) else output
            self.outputs[address] = out.detach().clone()
        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def _hooked(model, ids, addresses):
    hooks = Hooks(model, addresses)
    with torch.no_grad():
        out = model(ids)
    hooks.remove()
    return hooks, out


def close(a, b, atol=ATOL):
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


def test_gpt2_every_name_equals_hooks_and_eager_patterns():
    model, ids = _gpt2()
    h = model.transformer.h
    heads, d_head = 4, 8
    names = ["hook_embed", "hook_pos_embed", "blocks.*.hook_resid_pre", "blocks.*.hook_resid_mid",
             "blocks.*.hook_resid_post", "blocks.*.hook_attn_out", "blocks.*.hook_mlp_out",
             "blocks.*.attn.*", "blocks.*.mlp.*", "blocks.*.ln1.hook_normalized",
             "blocks.*.ln2.hook_normalized", "ln_final.hook_normalized"]
    trace = tl.trace(model, ids, save=names)
    subs = ["transformer.wte", "transformer.wpe", "transformer.ln_f"] + [
        f"transformer.h.{i}{s}" for i in range(2) for s in
        ("", ".attn", ".mlp", ".ln_1", ".ln_2", ".attn.c_attn", ".attn.c_proj", ".mlp.c_fc",
         ".mlp.c_proj")]
    hooks, _ = _hooked(model, ids, subs)
    o, i = hooks.outputs, hooks.inputs
    close(trace["hook_embed"].out, o["transformer.wte"])
    close(trace["hook_pos_embed"].out, o["transformer.wpe"].expand_as(o["transformer.wte"]))
    close(trace["ln_final.hook_normalized"].out, o["transformer.ln_f"])
    pattern_eager = _eager(model)(ids, output_attentions=True).attentions
    for layer in range(len(h)):
        b = f"transformer.h.{layer}"
        pre = i[b]
        close(trace[f"blocks.{layer}.hook_resid_pre"].out, pre)
        close(trace[f"blocks.{layer}.hook_attn_out"].out, o[f"{b}.attn"])
        close(trace[f"blocks.{layer}.hook_resid_mid"].out, pre + o[f"{b}.attn"])
        close(trace[f"blocks.{layer}.hook_mlp_out"].out, o[f"{b}.mlp"])
        close(trace[f"blocks.{layer}.hook_resid_post"].out, o[b])
        close(trace[f"blocks.{layer}.ln1.hook_normalized"].out, o[f"{b}.ln_1"])
        close(trace[f"blocks.{layer}.ln2.hook_normalized"].out, o[f"{b}.ln_2"])
        q, k, v = o[f"{b}.attn.c_attn"].split(32, dim=-1)
        for name, value in (("q", q), ("k", k), ("v", v)):
            close(trace[f"blocks.{layer}.attn.hook_{name}"].out,
                  value.unflatten(-1, (heads, d_head)))
        z = i[f"{b}.attn.c_proj"].unflatten(-1, (heads, d_head))
        close(trace[f"blocks.{layer}.attn.hook_z"].out, z)
        close(trace[f"blocks.{layer}.attn.hook_pattern"].out, pattern_eager[layer])
        scores = trace[f"blocks.{layer}.attn.hook_attn_scores"].out
        assert torch.isinf(scores[..., 0, 1:]).all()  # causal: the first query sees key 0 only
        close(torch.softmax(scores, -1), pattern_eager[layer])
        result = trace[f"blocks.{layer}.attn.hook_result"].out
        assert list(result.shape) == [2, 7, heads, 32]
        close(result.sum(2) + h[layer].attn.c_proj.bias, o[f"{b}.attn"], atol=1e-5)
        close(trace[f"blocks.{layer}.mlp.hook_pre"].out, o[f"{b}.mlp.c_fc"])
        close(trace[f"blocks.{layer}.mlp.hook_post"].out, i[f"{b}.mlp.c_proj"])
    assert trace.meta["names"]["blocks.0.hook_resid_post"].startswith("add_")


def test_names_read_from_a_save_all_trace_and_short_forms():
    model, ids = _gpt2()
    full = tl.trace(model, ids, save="all")
    named = tl.trace(model, ids, save=["resid_post.1", "z.0"])
    close(full["blocks.1.hook_resid_post"].out, named["blocks.1.hook_resid_post"].out, atol=0)
    close(full["z.0"].out, named["blocks.0.attn.hook_z"].out, atol=0)
    with pytest.raises(TorchLensError) as info:
        full["blocks.0.attn.hook_pattern"].out  # noqa: B018 - computed only when asked for
    assert info.value.code == "activation_not_saved"
    assert "hook_pattern" in info.value.teach[0]


def test_head_edit_on_z_equals_a_hook_on_the_merged_heads():
    model, ids = _gpt2()
    trace = tl.trace(model, ids, edits={"blocks.1.attn.hook_z": tl.edits.zero(head=[1, 3])})

    def zero_heads(module, args):
        x = args[0].clone()
        x[..., 8:16] = 0
        x[..., 24:32] = 0
        return (x,)

    handle = model.transformer.h[1].attn.c_proj.register_forward_pre_hook(zero_heads)
    with torch.no_grad():
        want = model(ids).logits
    handle.remove()
    close(trace.output["logits"], want, atol=1e-5)
    row = trace.meta["edits"]["fired"][0]
    assert row["site"] == "blocks.1.attn.hook_z"
    assert row["label"].startswith("scaled_dot_product_attention")


def test_pattern_edit_recomputes_the_fused_call():
    model, ids = _gpt2()
    clean = tl.trace(model, ids, save=["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_v"])
    pattern = clean["blocks.0.attn.hook_pattern"].out.clone()
    pattern[:, 2, :, 0] = 0  # head 2 ignores the first token
    v = clean["blocks.0.attn.hook_v"].out.transpose(1, 2)  # (b, head, pos, d)
    z = (pattern @ v).transpose(1, 2)
    every = slice(None)
    edited = tl.trace(model, ids, edits={
        "blocks.0.attn.hook_pattern": tl.edits.zero(index=(every, every, every, 0), head=2)})
    by_z = tl.trace(model, ids, edits={"blocks.0.attn.hook_z": tl.edits.replace(z)})
    close(edited.output["logits"], by_z.output["logits"], atol=1e-5)
    assert not torch.allclose(edited.output["logits"], model(ids).logits, atol=1e-4)


def test_llama_gqa_rotary_names():
    model, ids = _llama()
    trace = tl.trace(model, ids, save=["blocks.*.attn.*", "blocks.*.hook_resid_mid",
                                       "blocks.*.mlp.*", "blocks.1.hook_resid_post"])
    layer = model.model.layers[0]
    hooks, _ = _hooked(model, ids, ["model.layers.0", "model.layers.0.self_attn.q_proj",
                                    "model.layers.0.self_attn.k_proj",
                                    "model.layers.0.self_attn.v_proj", "model.layers.0.self_attn",
                                    "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj",
                                    "model.layers.1"])
    o, i = hooks.outputs, hooks.inputs
    assert list(trace["blocks.0.attn.hook_k"].out.shape) == [1, 6, 2, 8]  # kv heads
    for name, heads in (("q", 4), ("k", 2), ("v", 2)):
        close(trace[f"blocks.0.attn.hook_{name}"].out,
              o[f"model.layers.0.self_attn.{name}_proj"].unflatten(-1, (heads, 8)))
    assert list(trace["blocks.0.attn.hook_rot_k"].out.shape) == [1, 6, 2, 8]
    rotated = trace["blocks.0.attn.hook_rot_q"].out
    assert not torch.allclose(rotated, trace["blocks.0.attn.hook_q"].out)
    eager = _eager(model)(ids, output_attentions=True).attentions
    close(trace["blocks.0.attn.hook_pattern"].out, eager[0])
    close(trace["blocks.1.attn.hook_pattern"].out, eager[1])
    close(trace["blocks.0.hook_resid_mid"].out, i["model.layers.0"] + o["model.layers.0.self_attn"])
    close(trace["blocks.0.mlp.hook_pre"].out, o["model.layers.0.mlp.gate_proj"])
    close(trace["blocks.0.mlp.hook_post"].out, i["model.layers.0.mlp.down_proj"])
    close(trace["blocks.1.hook_resid_post"].out, o["model.layers.1"])
    result = trace["blocks.0.attn.hook_result"].out
    close(result.sum(2), o["model.layers.0.self_attn"], atol=1e-5)
    with pytest.raises(TorchLensError) as info:
        tl.trace(model, ids, save=["hook_pos_embed"])
    assert info.value.code == "site_not_in_architecture"
    assert "position" in str(info.value)
    assert layer is model.model.layers[0]


def test_neox_parallel_residual_refuses_resid_mid_and_globs_skip_it():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPTNeoXForCausalLM(GPTNeoXConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=64, use_parallel_residual=True,
            bos_token_id=1, eos_token_id=2)).eval()
    ids = torch.randint(0, 100, (1, 5), generator=torch.Generator().manual_seed(3))
    with pytest.raises(TorchLensError) as info:
        tl.trace(model, ids, save=["blocks.0.hook_resid_mid"])
    assert info.value.code == "site_not_in_architecture"
    assert "parallel" in str(info.value)
    trace = tl.trace(model, ids, save=["blocks.*.hook_resid_*", "blocks.0.attn.hook_pattern",
                                       "blocks.0.attn.hook_rot_q"])
    assert "blocks.0.hook_resid_mid" not in trace.meta["names"]
    hooks, _ = _hooked(model, ids, ["gpt_neox.layers.0", "gpt_neox.layers.1"])
    close(trace["blocks.0.hook_resid_post"].out, hooks.outputs["gpt_neox.layers.0"])
    close(trace["blocks.1.hook_resid_pre"].out, hooks.inputs["gpt_neox.layers.1"])
    close(trace["blocks.0.attn.hook_pattern"].out,
          _eager(model)(ids, output_attentions=True).attentions[0])


def test_bert_post_ln_names_and_bidirectional_pattern():
    from transformers import BertConfig, BertModel
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=64)).eval()
    ids = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(4))
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    inputs = {"input_ids": ids, "attention_mask": mask}
    trace = tl.trace(model, inputs, save=["blocks.0.hook_resid_mid", "blocks.0.hook_resid_post",
                                          "blocks.0.attn.hook_pattern", "blocks.1.hook_resid_pre",
                                          "blocks.0.ln1.hook_normalized"])
    holder = {}
    handles = [model.encoder.layer[0].attention.output.LayerNorm.register_forward_hook(
        lambda m, a, o: holder.__setitem__("mid", a[0].clone())),
        model.encoder.layer[0].output.LayerNorm.register_forward_hook(
        lambda m, a, o: holder.__setitem__("post", a[0].clone())),
        model.encoder.layer[0].attention.output.LayerNorm.register_forward_hook(
        lambda m, a, o: holder.__setitem__("ln1", o.clone())),
        model.encoder.layer[0].register_forward_hook(
        lambda m, a, o: holder.__setitem__("out", (o[0] if isinstance(o, tuple) else o).clone()))]
    with torch.no_grad():
        model(**inputs)
    for h in handles:
        h.remove()
    close(trace["blocks.0.hook_resid_mid"].out, holder["mid"])
    close(trace["blocks.0.hook_resid_post"].out, holder["post"])
    close(trace["blocks.0.ln1.hook_normalized"].out, holder["ln1"])
    close(trace["blocks.1.hook_resid_pre"].out, holder["out"])
    pattern = trace["blocks.0.attn.hook_pattern"].out
    close(pattern, _eager(model)(**inputs, output_attentions=True).attentions[0])
    assert (pattern[..., 5] == 0).all()  # the padded key is masked for every query


def test_refusals_are_typed_and_come_before_the_capture():
    model, ids = _gpt2()
    before = [p.clone() for p in model.parameters()]
    cases = [
        (dict(save=["blocks.5.hook_resid_pre"]), "site_not_in_architecture"),
        (dict(edits={"blocks.0.hook_resid_post": tl.edits.zero(head=1)}),
         "edit_head_not_attention"),
        (dict(edits={"blocks.0.attn.hook_z": tl.edits.zero(index=(0, 1, 2), head=1)}),
         "edit_invalid"),
        (dict(edits={"blocks.0.attn.hook_result": tl.edits.zero()}), "edit_name_read_only"),
    ]
    for options, code in cases:
        with pytest.raises(TorchLensError) as info:
            tl.trace(model, ids, **options)
        assert info.value.code == code, (options, info.value)
        assert info.value.teach
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(TorchLensError) as info:
        tl.edits.zero(head="all")
    assert info.value.code == "edit_invalid"


def test_residual_algebra_adds_up_to_the_run():
    model, ids = _gpt2()
    trace = tl.trace(model, ids, save="all")
    view = tl.transformer(trace)
    assert "blocks.1.attn.hook_pattern" in view.names and "hook_pos_embed" in view.names
    acc, labels = view.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    close(acc[-1], trace["blocks.1.hook_resid_post"].out, atol=0)
    parts, labels = view.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    close(parts.sum(0), trace["blocks.1.hook_resid_post"].out, atol=1e-5)
    heads, labels = view.stack_head_results(return_labels=True)
    assert labels[:5] == ["L0H0", "L0H1", "L0H2", "L0H3", "L1H0"] and heads.shape[0] == 8
    bias = model.transformer.h[0].attn.c_proj.bias
    close(heads[:4].sum(0) + bias, trace["blocks.0.hook_attn_out"].out, atol=1e-5)
    ln = model.transformer.ln_f
    normed = view.apply_ln_to_stack(acc[-1:], layer=None)[0]
    close(normed * ln.weight + ln.bias, trace["ln_final.hook_normalized"].out, atol=1e-5)
    # direct logit attribution: the components' shares plus the final norm's bias give the logit
    tokens = ids[:, -1]
    attrs = view.logit_attrs(view.decompose_resid(pos_slice=-1), tokens, pos_slice=-1)
    logits = trace.output["logits"][torch.arange(2), -1, tokens]
    close(attrs.sum(0) + model.lm_head.weight[tokens] @ ln.bias, logits, atol=1e-4)
    lens = view.logit_lens(k=3)
    assert len(lens) == 2 * 2 * 7
    last = [r for r in lens.rows if r["layer"] == 1 and r["batch"] == 0]
    assert [r["tokens"][0] for r in last] == trace.output["logits"][0].argmax(-1).tolist()
    assert "<table" in lens.to_html() and list(lens.to_pandas().columns)[:3] == [
        "layer", "batch", "pos"]
    with pytest.raises(TorchLensError) as info:
        tl.transformer(tl.trace(model, ids, save=["blocks.0.hook_resid_pre"])).accumulated_resid()
    assert info.value.code == "activation_not_saved"


def test_names_in_a_patching_sweep_equal_their_op_labels():
    model, ids = _gpt2()
    clean, corrupt = ids[:1], ids[:1].flip(1)

    def metric(out):
        return out.logits[0, -1, 3] - out.logits[0, -1, 5]

    by_name = tl.patching.sweep(model, clean, corrupt, sites=["blocks.*.hook_resid_pre"],
                                metric=metric)
    labels = tl.trace(model, clean, save=["blocks.*.hook_resid_pre"]).meta["names"]
    by_label = tl.patching.sweep(model, clean, corrupt, sites=list(labels.values()),
                                 metric=metric)
    assert by_name.sites == ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]
    close(by_name.values, by_label.values, atol=0)
    batched = tl.patching.sweep(model, clean, corrupt, sites=["blocks.*.hook_resid_pre"],
                                metric=metric, batch_size=4)
    close(batched.values, by_name.values, atol=1e-6)


def test_names_in_a_recording_equal_the_trace(tmp_path):
    model, ids = _gpt2()
    save = ["blocks.*.hook_resid_post", "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_z"]
    rec = tl.record(model, [ids[:1], ids[1:]], save=save)
    assert rec.labels == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post",
                          "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_z"]
    want = tl.trace(model, ids[1:], save=save)
    for name in rec.labels:
        close(rec[name][1], want[name].out[0], atol=1e-6)
    store = tl.record(model, [ids[:1], ids[1:]], save=save, to=tmp_path / "store")
    close(store["blocks.0.attn.hook_pattern"][1:2], want["blocks.0.attn.hook_pattern"].out,
          atol=1e-6)


def test_gradients_at_names_in_their_layout():
    model, ids = _gpt2()
    trace = tl.trace(model, ids, save=None,
                     save_grads=["blocks.1.hook_resid_pre", "blocks.0.attn.hook_z"])
    trace.backward(lambda out: out.logits[:, -1, 3].sum())
    holder = {}

    def keep(module, args):
        args[0].retain_grad()
        holder["x"] = args[0]

    handle = model.transformer.h[0].attn.c_proj.register_forward_pre_hook(keep)
    model.zero_grad()
    model(ids).logits[:, -1, 3].sum().backward()
    handle.remove()
    z_grad = holder["x"].grad.unflatten(-1, (4, 8))
    close(trace["blocks.0.attn.hook_z"].grad, z_grad, atol=1e-6)
    assert list(trace["blocks.1.hook_resid_pre"].grad.shape) == [2, 7, 32]
    with pytest.raises(TorchLensError) as info:
        tl.trace(model, ids, save_grads=["blocks.0.attn.hook_z"],
                 grad_edits={"blocks.0.attn.hook_z": tl.edits.zero()})
    assert info.value.code == "edit_invalid"


class WrongHeads:
    """A plugin whose torchlens_transformer_hints contradict the graph (8 heads, not 4)."""

    @tl.hookimpl
    def torchlens_transformer_hints(self, model):
        return {"n_heads": 8}


def test_a_hint_the_graph_contradicts_refuses_and_config_hints_agree():
    from torchlens.anatomy.bind import hints as config_hints
    from torchlens.plugins import get_plugin_manager

    model, ids = _gpt2()
    hints = config_hints(model)  # torchlens-hf: from the config
    assert hints["n_heads"] == [4] and hints["d_head"] == [8] and hints["unembed"] == ["lm_head"]
    assert hints["embed"] == ["transformer.wte"]
    assert tl.trace(model, ids, save=["blocks.0.attn.hook_z"])  # the config agrees
    pm = get_plugin_manager()
    plugin = WrongHeads()
    pm.register(plugin)
    try:
        with pytest.raises(TorchLensError) as info:
            tl.trace(model, ids, save=["blocks.0.attn.hook_z"])
        assert info.value.code == "transformer_hint_disagrees"
        assert "n_heads=8" in str(info.value)
    finally:
        pm.unregister(plugin)


def test_binding_names_leaves_a_kv_cache_and_the_rng_as_a_plain_call_would():
    from transformers import DynamicCache

    model, ids = _gpt2()
    plain_cache, traced_cache = DynamicCache(), DynamicCache()
    with torch.no_grad():
        model(ids, past_key_values=plain_cache, use_cache=True)
    state = torch.random.get_rng_state()
    trace = tl.trace(model, {"input_ids": ids, "past_key_values": traced_cache,
                             "use_cache": True}, save=["blocks.1.hook_resid_post"])
    assert torch.equal(torch.random.get_rng_state(), state)
    assert traced_cache.get_seq_length() == plain_cache.get_seq_length() == 7
    close(traced_cache.layers[0].keys, plain_cache.layers[0].keys, atol=0)
    assert trace["blocks.1.hook_resid_post"].saved


def test_record_binds_names_in_edits():
    """tl.record's edits= take transformer names, bound to the first input's graph: zeroing
    head 1 of blocks.1.attn.hook_z records what the same edit at its op label records."""
    model, ids = _gpt2()
    data = [ids, ids.flip(1)]
    label = tl.trace(model, ids, save=["blocks.1.attn.hook_z"]).meta["names"][
        "blocks.1.attn.hook_z"]
    named = tl.record(model, data, save=["transformer.h.1"],
                      edits={"blocks.1.attn.hook_z": tl.edits.zero(head=1)})
    by_label = tl.record(model, data, save=["transformer.h.1"],
                         edits={label: tl.edits.zero(index=(slice(None), 1))})
    plain = tl.record(model, data, save=["transformer.h.1"])
    assert torch.equal(named["transformer.h.1"], by_label["transformer.h.1"])
    assert not torch.allclose(named["transformer.h.1"], plain["transformer.h.1"])
    assert named.provenance[0]["edits"][0]["site"] == "blocks.1.attn.hook_z"


def test_a_recording_of_module_outputs_runs_no_per_op_mode():
    """Names whose anchor is a module's whole output (each block's hook_resid_post, an attention
    module's hook_attn_out, the final norm's output) are kept from that module's frame: no torch
    function mode runs in the forward, and the values are the trace's. A name inside a module
    (hook_z) still counts the ops."""
    from torch.overrides import _get_current_function_mode_stack

    model, ids = _gpt2()
    save = ["blocks.*.hook_resid_post", "blocks.0.hook_attn_out", "ln_final.hook_normalized"]
    want = tl.trace(model, ids, save=save)  # binds the names to this input signature
    modes = []
    handle = model.transformer.h[1].register_forward_pre_hook(
        lambda module, args: modes.append(len(_get_current_function_mode_stack())))
    try:
        rec = tl.record(model, ids, save=save)
        tl.record(model, ids, save=["blocks.1.attn.hook_z"])
    finally:
        handle.remove()
    assert modes == [0, 1]
    assert rec.labels == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post",
                          "blocks.0.hook_attn_out", "ln_final.hook_normalized"]
    for name in rec.labels:
        assert torch.equal(rec[name][0], want[name].out[0])


def test_a_block_returning_another_tensor_too_records_its_stream():
    """A block whose output holds a tensor no op made (a parameter) besides its stream: the
    recording reads the stream out of the module's output, by the anchor's shape."""
    from .test_flex_attention_names import Block, Model

    class Paired(Block):
        def forward(self, x):
            return super().forward(x), self.ln1.weight

    class PairedModel(Model):
        def forward(self, ids):
            x = self.embed(ids)
            for block in self.layers:
                x = block(x)[0]
            return self.unembed(self.ln_final(x))

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = Model(flex=False).eval()
    model.__class__ = PairedModel
    for layer in model.layers:
        layer.__class__ = Paired
    ids = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(3))
    want = tl.trace(model, ids, save=["blocks.*.hook_resid_post"])
    rec = tl.record(model, ids, save=["blocks.*.hook_resid_post"])
    for layer in range(len(model.layers)):
        name = f"blocks.{layer}.hook_resid_post"
        assert torch.equal(rec[name][0], want[name].out[0])


@pytest.mark.parametrize("how", ["trace", "pattern", "edit", "record"])
def test_a_dropped_names_capture_leaves_no_reference_cycles(how):
    """Names, derived patterns, name edits and recordings by name are freed as soon as they
    are dropped (a cycle would keep the trace's values, a language model's logits among them,
    until the collector runs)."""
    import gc

    model, ids = _gpt2()
    calls = {"trace": lambda: tl.trace(model, ids, save=["blocks.*.hook_resid_post"]),
             "pattern": lambda: tl.trace(model, ids, save=["blocks.0.attn.hook_pattern"]),
             "edit": lambda: tl.trace(model, ids, save=None, edits={
                 "blocks.0.attn.hook_pattern": tl.edits.zero(head=1)}),
             "record": lambda: tl.record(model, ids, save=["blocks.*.hook_resid_post"])}
    calls[how]()  # the structure is bound once per model and input signature
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        calls[how]()
        assert gc.collect() == 0
    finally:
        if enabled:
            gc.enable()
