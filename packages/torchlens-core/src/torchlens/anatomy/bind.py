"""Transformer names bound to a model: each name's anchor op and lens, from its structure.

``structure_of(model, trace)`` reads (and keeps, per trace) the structure; ``anchor`` turns one
canonical name into (anchor op label, lens) or refuses ``site_not_in_architecture`` with the
reason; ``bind`` does it for every site string a surface was given, running one metadata-only
capture of the same input first when no trace of it exists yet (its labels are the labels the
real capture will make).
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from .. import capabilities
from ..capture.entry import pinned_capture
from ..errors import InputError, SiteUnknown
from ..plugins import get_plugin_manager, hook
from ..sites import Site, match_names, parse_site, transformer_name
from .lens import (
    Batched,
    FlexInput,
    FlexPattern,
    FlexScores,
    Lens,
    Reshaped,
    Result,
    SdpaInput,
    SdpaPattern,
    SdpaScores,
    SplitHeads,
    Transposed,
    norm_lens,
)
from .structure import Structure, read

# model -> {signature: its probe's Trace, (signature, hints): the Structure read from it}
_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_hints: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (plugins, hints)


def hints(model: nn.Module) -> dict[str, list[Any]]:
    """What plugins know of the model's anatomy (``torchlens_transformer_hints``): each key's
    values, one a plugin (the graph checks every one). Asked again when the plugins change."""
    return _hints_of(model)[0]


def _hints_of(model: nn.Module) -> tuple[dict[str, list[Any]], str]:
    """``hints(model)`` and its repr (what a kept structure is keyed by)."""
    plugins = frozenset(get_plugin_manager().get_plugins())  # held: no id reused meanwhile
    kept = _hints.get(model)
    if kept is not None and kept[0] == plugins:
        return kept[1]
    merged: dict[str, list[Any]] = {}
    for found in hook().torchlens_transformer_hints(model=model) or ():
        for key, value in (found or {}).items():
            if value is not None:
                merged.setdefault(key, []).append(value)
    _hints[model] = (plugins, (merged, repr(merged)))
    return merged, repr(merged)


def structure_of(model: nn.Module, trace: Any) -> Structure:
    """The structure of ``model`` read from ``trace``, kept on the trace."""
    found = trace._objects.get("transformer_structure")
    if found is None:
        found = trace._objects["transformer_structure"] = read(trace, model, hints(model))
    return found


def _signature(args: tuple, kwargs: dict) -> tuple:
    return tuple((k, tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else (k, repr(v))
                 for k, v in [*enumerate(args), *sorted(kwargs.items())])


def probe(model: nn.Module, args: tuple, kwargs: dict, inv: Any = None) -> Structure:
    """The structure from one metadata-only capture of these inputs (kept per model and input
    signature), pinned as ``tl.summary``'s: the model, the RNG and the inputs left as they
    were."""
    per_model = _cache.setdefault(model, {})
    key = _signature(args, kwargs)
    said, said_text = _hints_of(model)
    found = per_model.get((key, said_text))  # read again when a plugin's hints change
    if found is not None:
        return found
    trace = per_model.get(key)
    if trace is None:
        # pinned (modes, RNG, buffers restored), on copies of stateful arguments (a KV cache
        # object the forward would grow)
        args, kwargs = tree_map(_copy_state, (args, kwargs))
        trace = per_model[key] = pinned_capture(
            model, args, kwargs, save=None, surface="transformer names", inv=inv,
            parts=capabilities.lookup("sharded_join")(model, []))  # whole shapes when sharded
    found = per_model[(key, said_text)] = read(trace, model, said)
    return found


def _copy_state(value: Any) -> Any:
    """A deep copy of an argument that is no tensor or plain value (it may hold state)."""
    if isinstance(value, (torch.Tensor, int, float, bool, str, type(None))):
        return value
    return copy.deepcopy(value)


@dataclass
class Bound:
    """A name bound to its anchor: the op label whose output it reads, through ``lens``."""

    name: str
    label: str
    lens: Lens

    def __post_init__(self) -> None:
        self.lens.name = self.name  # what another trace is looked up by for the same place


def anchor(structure: Structure, name: str, model: nn.Module) -> Bound:
    """Where canonical ``name`` lives in ``structure``; refuses when the architecture has none."""
    top = {"hook_embed": structure.embed, "hook_pos_embed": structure.pos_embed,
           "ln_final.hook_normalized": structure.ln_final}
    if name in top:
        if top[name] is None:
            raise _missing(name, structure.missing.get(name, "not found in the graph"))
        if name == "hook_pos_embed":
            return Bound(name, top[name], Batched(structure.batch))
        if name == "ln_final.hook_normalized":
            final = model.get_submodule(structure.ln_final_module)
            return Bound(name, top[name], norm_lens(final))
        return Bound(name, top[name], Lens())
    _, layer_text, hook = name.split(".", 2)
    layer = int(layer_text)
    if layer >= len(structure.blocks):
        raise InputError(
            f"{name!r}: the model has {len(structure.blocks)} blocks "
            f"({structure.blocks_address}.0 .. {len(structure.blocks) - 1})",
            code="site_not_in_architecture",
            teach=[f"save=['blocks.{len(structure.blocks) - 1}.{hook}']"])
    block = structure.blocks[layer]
    plain = {"hook_resid_pre": block.resid_pre, "hook_resid_mid": block.resid_mid,
             "hook_resid_post": block.resid_post, "hook_attn_out": block.attn_out,
             "hook_mlp_out": block.mlp_out, "ln1.hook_normalized": block.ln1,
             "ln2.hook_normalized": block.ln2, "mlp.hook_pre": block.mlp_pre,
             "mlp.hook_post": block.mlp_post}
    if hook in plain:
        if plain[hook] is None:
            raise _missing(name, block.missing.get(hook, "not found in the graph"))
        if hook.endswith("hook_normalized"):
            lens = norm_lens(model.get_submodule(block.norms[plain[hook]]))
            if plain[hook] in block.shapes:
                return Bound(name, plain[hook], Reshaped(block.shapes[plain[hook]], lens))
            return Bound(name, plain[hook], lens)
        if plain[hook] in block.shapes:
            return Bound(name, plain[hook], Reshaped(block.shapes[plain[hook]]))
        return Bound(name, plain[hook], Lens())
    att = block.attention
    if att is None:
        raise _missing(name, block.missing.get("attn", "no attention op"))
    return Bound(name, *_attention(name, hook, att, structure, model))


def _attention(name: str, hook: str, att: Any, structure: Structure, model: nn.Module
               ) -> tuple[str, Lens]:
    if hook in att.refused:
        raise _missing(name, att.refused[hook])
    if hook in ("attn.hook_q", "attn.hook_k", "attn.hook_v"):
        role = hook[-1]
        proj = getattr(att, f"{role}_proj")
        if proj is not None:
            heads = att.n_heads if role == "q" else att.n_kv_heads
            return proj, SplitHeads(heads)
        if att.rotary and role in "qk":
            raise _missing(name, "rotary positions are applied to a fused projection before "
                           "the attention; hook_rot_q / hook_rot_k are the rotated values")
        return _operand(name, att, role)
    if hook in ("attn.hook_rot_q", "attn.hook_rot_k"):
        if not att.rotary:
            raise _missing(name, "the model applies no rotary position embedding")
        return _operand(name, att, hook[-1])
    if hook == "attn.hook_z":
        return att.z, Transposed()
    if hook in ("attn.hook_attn_scores", "attn.hook_pattern"):
        if att.kind == "sdpa":
            return att.op, SdpaScores() if hook.endswith("scores") else SdpaPattern()
        if att.kind == "flex":
            return att.op, FlexScores() if hook.endswith("scores") else FlexPattern()
        return (att.scores if hook.endswith("scores") else att.op), Lens(head_axis=1)
    if hook == "attn.hook_result":
        out = _submodule(model, att.out_proj) if att.out_proj else None
        if out is None or getattr(out, "weight", None) is None:
            raise _missing(name, "no output projection after the attention")
        # nn.Linear stores (out, in); a Conv1D (GPT-2) (in, out)
        transposed = not isinstance(out, nn.Linear)
        return att.z, Result(Transposed(), out.weight, transposed)
    raise _missing(name, "not a name of the vocabulary")


def _submodule(model: nn.Module, address: str) -> nn.Module | None:
    try:
        return model.get_submodule(address)
    except AttributeError:
        return None


def _operand(name: str, att: Any, role: str) -> tuple[str, Lens]:
    """q, k or v as the attention takes them, ``[batch, pos, head, d_head]``."""
    if role in att.from_call:
        return att.op, FlexInput(role) if att.kind == "flex" else SdpaInput(role)
    label = getattr(att, role)
    if label is None:
        raise _missing(name, "the attention's inputs are not separate tensors in "
                       "[batch, head, pos, d_head]")
    return label, Transposed()


def _missing(name: str, why: str) -> InputError:
    return InputError(f"{name!r} does not exist in this architecture: {why}",
                      code="site_not_in_architecture",
                      teach=["tl.transformer(trace).names  # the names this model has",
                             "tl.trace(model, x, save='blocks.*.hook_resid_post')"])


def expand(text: str, structure: Structure, model: nn.Module) -> list[Bound]:
    """The bound names one site string spells: one, or every name a glob matches that the
    architecture has (a glob matching none refuses)."""
    canonical = transformer_name(text)
    matched = match_names(canonical, len(structure.blocks))
    if not matched:
        raise InputError(f"{text!r} matches no transformer name of a {len(structure.blocks)}-"
                         "block model", code="site_not_in_architecture",
                         teach=["tl.transformer(trace).names  # the names this model has"])
    if len(matched) == 1 and matched[0] == canonical:
        return [anchor(structure, canonical, model)]
    bound = []
    for name in matched:
        try:
            bound.append(anchor(structure, name, model))
        except InputError:
            continue  # a glob takes the names this architecture has
    if not bound:
        raise _missing(text, "none of the names it matches exists here")
    return bound


def names_in(texts: Any, addresses: list[str]) -> list[str]:
    """The strings among ``texts`` that are transformer names (not op labels or modules)."""
    if not isinstance(texts, (list, tuple, set, frozenset, str)):
        return []
    texts = [texts] if isinstance(texts, str) else list(texts)
    out = []
    for text in texts:
        if not isinstance(text, str) or text in ("all", "none"):
            continue
        try:
            sites = parse_site(text, addresses)
        except SiteUnknown:  # the surface refuses it with its own code later
            continue
        if sites and sites[0].kind == "name":
            out.append(text)
    return out


def as_sites(bound: list[Bound], text: str) -> list[Site]:
    """Op sites standing for bound names (what an edit plan takes), each with its lens."""
    return [Site(text, "op", b.label, None, b.lens) for b in bound]
