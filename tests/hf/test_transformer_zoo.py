"""TransformerLens's names over a zoo of transformer architectures built from configs
(``tests/models/transformers_zoo.py``): every name TorchLens resolves equals an independent
reference -- a forward hook on the module that computes it, a hand computation from one, or the
eager implementation's ``output_attentions=True`` patterns -- and every name it does not resolve
refuses ``site_not_in_architecture`` with its reason. ``zoo_table()`` writes the table of
docs/guides/transformer-zoo.md from the same runs; a test fails when the page's table is stale.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import pytest
import torch

import torchlens as tl
from tests.models.transformers_zoo import CASES_BY_NAME, TRANSFORMER_CASES, build
from torchlens.anatomy.bind import anchor
from torchlens.errors import TorchLensError
from torchlens.sites import transformer_names

ATOL = 1e-5
PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "transformer-zoo.md"
START, END = "<!-- zoo-table:start -->", "<!-- zoo-table:end -->"


@functools.cache
def resolved(case_name: str) -> tuple[list[str], dict[str, str]]:
    """The names the case's model resolves, and each other name's refusal reason."""
    model, x = build(CASES_BY_NAME[case_name])
    view = tl.transformer(tl.trace(model, x, save="all"))
    names = view.names
    refused = {}
    for name in transformer_names(view.n_layers):
        if name in names:
            continue
        with pytest.raises(TorchLensError) as info:
            anchor(view.structure, name, model)
        assert info.value.code == "site_not_in_architecture", (name, info.value)
        refused[name] = info.value.message.split(" does not exist in this architecture: ", 1)[-1]
    if refused:  # the surfaces refuse the same way, before any capture
        with pytest.raises(TorchLensError) as info:
            tl.trace(model, x, save=[next(iter(refused))])
        assert info.value.code == "site_not_in_architecture"
    return names, refused


# ---- references: forward hooks on the model's own modules, hand computations ---------------


class Hooks:
    """Each module's first input and its output (the first of a tuple), cloned as it runs."""

    def __init__(self, model, addresses):
        self.inputs, self.outputs, self.handles = {}, {}, []
        modules = dict(model.named_modules())
        for address in dict.fromkeys(addresses):
            self.handles.append(modules[address].register_forward_hook(
                self._keep(address), with_kwargs=True))

    def _keep(self, address):
        def hook(module, args, kwargs, output):
            first = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values())))
            self.inputs[address] = first.detach().clone()
            out = output[0] if isinstance(output, tuple) else output
            self.outputs[address] = out.detach().clone()
        return hook

    def remove(self):
        for handle in self.handles:
            handle.remove()


def eager_twin(model):
    """A copy of the model running the eager attention implementation."""
    twin = copy.deepcopy(model)
    for module in twin.modules():
        if hasattr(module, "config"):
            module.config._attn_implementation = "eager"
    return twin


def normalized(module, x):
    """A norm's value before its scale and shift, by hand from its input: (x - mean) / std for
    a LayerNorm, x / rms for an RMSNorm."""
    eps = getattr(module, "eps", None) or getattr(module, "variance_epsilon", None) or 1e-5
    x = x.float()
    if "rms" in type(module).__name__.lower():
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    mean = x.mean(-1, keepdim=True)
    return (x - mean) * torch.rsqrt((x - mean).pow(2).mean(-1, keepdim=True) + eps)


def split_fused(out, layout, heads, kv_heads, d_head):
    """q, k, v ([batch, pos, head, d_head]) from a fused projection's output."""
    if layout == "cat":
        q, k, v = out.split([heads * d_head, kv_heads * d_head, kv_heads * d_head], dim=-1)
        return [t.unflatten(-1, (-1, d_head)) for t in (q, k, v)]
    if layout == "heads":  # per head: q, k, v of d_head each
        return list(out.unflatten(-1, (heads, 3 * d_head)).split(d_head, dim=-1))
    if layout == "codegen":  # 4 model-parallel pieces, each q | v | k of heads / 4 heads
        q, v, k = out.unflatten(-1, (4, -1)).split(heads // 4 * d_head, dim=-1)
        return [t.reshape(*out.shape[:-1], heads, d_head) for t in (q, k, v)]
    if layout == "mqa":  # q heads, then one k head and one v head
        return list(out.unflatten(-1, (heads + 2, d_head)).split([heads, 1, 1], dim=-2))
    raise ValueError(layout)


def scores_by_hand(q, k, scale, softcap):
    """``q k^T * scale`` ([batch, head, q, k]) from q and k as ``[batch, pos, head, d_head]``,
    each kv head serving its group of q heads; capped as the config says."""
    if k.shape[2] != q.shape[2]:
        k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    return softcap * torch.tanh(scores / softcap) if softcap else scores


def close(got, want, what, atol=ATOL):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    torch.testing.assert_close(got.float(), want.float(), atol=atol, rtol=0, msg=what)


def references(case, model, x):
    """Every name's reference value (or the check standing for one), from hooks on a plain
    forward and the eager implementation's patterns."""
    parts = case.parts
    config = model.config
    heads = config.num_attention_heads if hasattr(config, "num_attention_heads") else \
        config.n_head
    blocks = model.get_submodule(parts["blocks"])
    modules = dict(model.named_modules())
    inv = {m: a for a, m in modules.items()}
    embed = inv.get(model.get_input_embeddings())  # a ViT's: its patch embedding
    addresses = [a for a in (embed, parts.get("pos"), parts.get("ln_final")) if a]
    for layer in range(len(blocks)):
        b = f"{parts['blocks']}.{layer}"
        addresses.append(b)
        addresses += [f"{b}.{parts[key]}" for key in (
            "q", "k", "v", "qkv", "o", "act_in", "gate_up", "down", "ln1", "ln2",
            "attn_branch", "mlp_branch") if parts.get(key)]
    hooks = Hooks(model, addresses)
    with torch.no_grad():
        model(**x)
    hooks.remove()
    patterns = eager_twin(model)(**x, output_attentions=True).attentions
    i, o = hooks.inputs, hooks.outputs
    batch, pos = i[f"{parts['blocks']}.0"].shape[:2]

    def stream(t):  # a value the model keeps as [batch * pos, width]
        return t.reshape(batch, pos, -1) if t.dim() == 2 else t

    want = {}
    if embed:
        want["hook_embed"] = o[embed]
    if parts.get("pos"):
        want["hook_pos_embed"] = o[parts["pos"]].expand(batch, pos, -1)
    if parts.get("ln_final"):
        want["ln_final.hook_normalized"] = normalized(modules[parts["ln_final"]],
                                                      i[parts["ln_final"]])
    for layer in range(len(blocks)):
        b, n = f"{parts['blocks']}.{layer}", f"blocks.{layer}."
        want[n + "hook_resid_pre"] = i[b]
        scaled = parts.get("branch_scale", 1)  # Granite scales each branch before its add
        want[n + "hook_attn_out"] = stream(o[f"{b}.{parts['attn_branch']}"]) * scaled
        if parts.get("mlp_branch"):
            want[n + "hook_mlp_out"] = stream(o[f"{b}.{parts['mlp_branch']}"]) * scaled
        if parts.get("post_ln"):  # the norms read the adds
            want[n + "hook_resid_mid"] = i[f"{b}.{parts['ln1']}"]
            want[n + "hook_resid_post"] = i[f"{b}.{parts['ln2']}"]
        else:
            want[n + "hook_resid_post"] = o[b]
            if not parts.get("parallel"):
                want[n + "hook_resid_mid"] = i[b] + want[n + "hook_attn_out"]
        for ln in ("ln1", "ln2"):
            if parts.get(ln):
                address = f"{b}.{parts[ln]}"
                want[f"{n}{ln}.hook_normalized"] = stream(normalized(modules[address],
                                                                     i[address]))
        z = i[f"{b}.{parts['o']}"]
        d_head = z.shape[-1] // heads
        want[n + "attn.hook_z"] = z.unflatten(-1, (heads, d_head))
        proj = modules[f"{b}.{parts['o']}"]
        bias = proj.bias if getattr(proj, "bias", None) is not None else 0
        want[n + "attn.hook_result"] = ("sum+bias", o[f"{b}.{parts['o']}"] - bias)
        if parts.get("qkv"):
            kv = 1 if parts["qkv_split"] == "mqa" else parts.get("n_kv")
            kv = kv or getattr(config, "num_key_value_heads", None) or heads
            q, k, v = split_fused(o[f"{b}.{parts['qkv']}"], parts["qkv_split"], heads, kv,
                                  d_head)
            want[n + "attn.hook_q"], want[n + "attn.hook_k"], want[n + "attn.hook_v"] = q, k, v
        elif parts.get("q"):
            q, k, v = (o[f"{b}.{parts[r]}"] for r in ("q", "k", "v"))
            kv = k.shape[-1] // d_head
            q, k, v = (t.unflatten(-1, (-1, d_head)) for t in (q, k, v))
            want[n + "attn.hook_q"], want[n + "attn.hook_k"], want[n + "attn.hook_v"] = q, k, v
        want[n + "attn.hook_pattern"] = patterns[layer]
        want[n + "attn.hook_attn_scores"] = ("softmax", patterns[layer])
        if not parts.get("alibi"):  # q k^T (rotated where rotary) makes the eager pattern
            scale = parts.get("scale", d_head ** -0.5)
            softcap = getattr(config, "attn_logit_softcapping", None)
            want[n + "qk"] = (scale, softcap, patterns[layer])
        if parts.get("act_in"):
            want[n + "mlp.hook_pre"] = stream(o[f"{b}.{parts['act_in']}"])
        if parts.get("gate_up"):
            want[n + "mlp.hook_pre"] = o[f"{b}.{parts['gate_up']}"].chunk(2, dim=-1)[0]
        if parts.get("down"):
            want[n + "mlp.hook_post"] = stream(i[f"{b}.{parts['down']}"])
    return want


# ---- the zoo ----------------------------------------------------------------------------


@pytest.mark.parametrize("case", TRANSFORMER_CASES, ids=lambda c: c.name)
def test_every_resolved_name_equals_an_independent_reference(case):
    names, refused = resolved(case.name)
    for layer in range(2):  # every model of the zoo has these
        for hook in ("hook_resid_pre", "hook_resid_post", "hook_attn_out", "hook_mlp_out",
                     "attn.hook_z", "attn.hook_result", "attn.hook_pattern",
                     "attn.hook_attn_scores"):
            assert f"blocks.{layer}.{hook}" in names, (case.name, hook, refused.get(
                f"blocks.{layer}.{hook}"))
    model, x = build(case)
    trace = tl.trace(model, x, save=names)
    want = references(case, model, x)
    got = {name: trace[name].out for name in names}
    checked = set()
    for name in names:
        if name.endswith(("attn.hook_rot_q", "attn.hook_rot_k")):
            continue  # checked through the pattern they make, below
        assert name in want, f"{case.name}: {name} resolved, but the zoo has no reference for it"
        ref = want[name]
        if isinstance(ref, tuple) and ref[0] == "sum+bias":  # heads' results add up
            close(got[name].sum(2), ref[1], f"{case.name} {name}")
        elif isinstance(ref, tuple) and ref[0] == "softmax":  # scores make the pattern
            scores = got[name]
            close(torch.softmax(scores.float(), -1), ref[1], f"{case.name} {name}")
            assert (scores[ref[1] == 0] < -1e4).all(), f"{case.name} {name}: masked scores"
        else:
            close(got[name], ref, f"{case.name} {name}")
        checked.add(name)
    for layer in range(2):
        n = f"blocks.{layer}."
        # rotated q and k (or q and k) make the eager implementation's pattern by hand
        rq, rk = (n + "attn.hook_rot_q", n + "attn.hook_rot_k")
        if rq not in names:
            rq, rk = n + "attn.hook_q", n + "attn.hook_k"
        if n + "qk" in want and rq in names and rk in names:
            scale, softcap, pattern = want[n + "qk"]
            scores = scores_by_hand(got[rq], got[rk], scale, softcap)
            scores = scores.masked_fill(pattern == 0, float("-inf"))
            close(torch.softmax(scores, -1), pattern, f"{case.name} {rq} x {rk}")
            checked |= {rq, rk}
        # the residual adds, read from the names themselves
        if n + "hook_resid_mid" in names:
            close(got[n + "hook_resid_mid"], got[n + "hook_resid_pre"] + got[n + "hook_attn_out"],
                  f"{case.name} resid_mid = resid_pre + attn_out")
        if case.parts.get("parallel") and n + "hook_mlp_out" in names:
            close(got[n + "hook_resid_post"], got[n + "hook_resid_pre"] + got[n + "hook_attn_out"]
                  + got[n + "hook_mlp_out"], f"{case.name} resid_post = pre + attn + mlp")
        elif not case.parts.get("post_ln") and n + "hook_mlp_out" in names and \
                n + "hook_resid_mid" in names:
            close(got[n + "hook_resid_post"], got[n + "hook_resid_mid"] + got[n + "hook_mlp_out"],
                  f"{case.name} resid_post = resid_mid + mlp_out")
    assert checked == set(names), f"{case.name}: unchecked {sorted(set(names) - checked)}"
    if case.parts.get("window"):  # a windowed layer: the last query does not see the first key
        assert any((got[f"blocks.{layer}.attn.hook_pattern"][..., -1, 0] == 0).all()
                   for layer in range(2)), case.name
    for name, why in refused.items():
        assert why and "not found in the graph" not in why, (case.name, name, why)


def test_a_pattern_sdpa_cannot_express_is_refused():
    """A config whose attention caps its logits (Gemma 2's softcapping) run through a fused
    scaled_dot_product_attention call: no pattern recomputed from the call is the
    architecture's, so scores and pattern refuse (transformers 5 refuses the combination
    itself; a model that drops the cap silently must not get a wrong pattern)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=4, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            attn_logit_softcapping=30.0)).eval()
    ids = torch.randint(3, 100, (1, 6), generator=torch.Generator().manual_seed(0))
    for name in ("blocks.0.attn.hook_pattern", "blocks.0.attn.hook_attn_scores"):
        with pytest.raises(TorchLensError) as info:
            tl.trace(model, ids, save=[name])
        assert info.value.code == "site_not_in_architecture"
        assert "softcapping" in str(info.value)
    assert tl.trace(model, ids, save=["blocks.0.attn.hook_z"])["blocks.0.attn.hook_z"].out.shape \
        == (1, 6, 4, 8)


def test_edits_through_the_new_lenses():
    """OPT's MLP runs on [batch * pos, width]: an edit of its names in [batch, pos, width]
    edits the real tensor (equal to a hook on the module); GPT-NeoX's v, read from the fused
    call's arguments, is read only."""
    model, x = build(CASES_BY_NAME["OPT"])
    delta = torch.linspace(-1, 1, 32)
    edited = tl.trace(model, x, edits={"blocks.0.hook_mlp_out": tl.edits.add(delta),
                                       "blocks.1.mlp.hook_post": tl.edits.zero(index=(0, 3))})
    handles = [
        model.model.decoder.layers[0].fc2.register_forward_hook(lambda m, a, o: o + delta),
        model.model.decoder.layers[1].fc2.register_forward_pre_hook(
            lambda m, a: (a[0].unflatten(0, (2, -1)).index_put((torch.tensor(0),
                                                                torch.tensor(3)),
                                                               torch.tensor(0.0)).flatten(0, 1),))]
    with torch.no_grad():
        want = model(**x).logits
    for handle in handles:
        handle.remove()
    close(edited.output["logits"], want, "OPT edits")
    with torch.no_grad():
        assert not torch.allclose(want, model(**x).logits, atol=1e-3)  # the edits edit
    model, x = build(CASES_BY_NAME["GPT-NeoX"])
    with pytest.raises(TorchLensError) as info:
        tl.trace(model, x, edits={"blocks.0.attn.hook_v": tl.edits.zero()})
    assert info.value.code == "edit_name_read_only"


# ---- the table of the docs ----------------------------------------------------------------


def _short(hook: str) -> str:
    return re.sub(r"^blocks\.\d+\.", "", hook)


def zoo_table() -> str:
    """The markdown table of docs/guides/transformer-zoo.md: per architecture, how many names
    resolve and each refused name (both blocks alike unless said) with its reason."""
    total = len(transformer_names(2))
    rows = [f"| architecture | what it adds | resolved (of {total}) | refused, and why |",
            "|---|---|---|---|"]
    for case in TRANSFORMER_CASES:
        names, refused = resolved(case.name)
        by_hook: dict[str, dict[str, list[int]]] = {}
        for name, why in refused.items():
            layer = re.match(r"blocks\.(\d+)\.", name)
            block = re.escape(case.parts["blocks"]) + r"\.\d+"
            why = re.sub(block, "the block", re.sub(block + r"\.", "", why))
            by_hook.setdefault(_short(name), {}).setdefault(why, []).append(
                int(layer.group(1)) if layer else -1)
        by_reason: dict[str, list[str]] = {}
        for hook, reasons in by_hook.items():
            for why, layers in reasons.items():
                where = "" if layers == [-1] or len(layers) == 2 else \
                    f" (block {', '.join(map(str, layers))})"
                by_reason.setdefault(why, []).append(f"`{hook}`{where}")
        cell = "<br>".join(f"{', '.join(hooks)}: {why}" for why, hooks in by_reason.items())
        kind = " (encoder)" if case.kind == "encoder" else ""
        cells = [f"{case.name}{kind}", case.note, str(len(names)), cell or "—"]
        rows.append("| " + " | ".join(c.replace("|", "&#124;") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def test_the_docs_table_is_the_zoo_table():
    text = PAGE.read_text()
    assert START in text and END in text, f"{PAGE} lacks the {START} ... {END} markers"
    page = text.split(START, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    fresh = zoo_table()
    assert page == fresh, (f"{PAGE.name}'s table is stale; paste this between the markers:\n\n"
                           f"{fresh}")
