"""The one site vocabulary: what ``save=``, edits and the viewer's search take.

A site is an op label (``relu_3``; ``linear_2:3`` one pass, the bare label every pass), a module
address (``transformer.h.3.mlp``: the module's output; ``layer1.0:2`` one call), or a glob over
module addresses (``transformer.h.*.mlp``), or a name of the transformer vocabulary that
TransformerLens taught the field (``blocks.3.hook_resid_post``, ``blocks.*.attn.hook_pattern``, the
short form ``resid_post.3``): kind "name", resolved from the op graph by ``torchlens.anatomy``.
``parse_site`` turns one string into a ``Site`` against the model's module addresses, before any
forward runs.
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import InputError, SiteUnknown

# what an op label looks like: a function name, its number, an optional pass
LABEL = re.compile(r"(?P<base>[A-Za-z_][A-Za-z0-9_]*?_\d+)(?::(?P<pass>\d+))?")
_GLOB = re.compile(r"[*?\[]")


@dataclass(frozen=True)
class Site:
    """A resolved site: ``kind`` "op" (``name`` a base label) or "module" (``name`` an
    address); ``pass_num`` None means every pass / call."""

    text: str
    kind: str
    name: str
    pass_num: int | None = None
    lens: Any = None  # a transformer name's view of its anchor (``anatomy.lens``)

    def matches(self, name: str, pass_num: int) -> bool:
        """Whether this site names the op or module ``name`` on pass ``pass_num``."""
        return name == self.name and (self.pass_num is None or self.pass_num == pass_num)


def split_pass(key: str) -> tuple[str, int | None]:
    """A key as (name, pass): ``"layer1.0:2"`` -> ``("layer1.0", 2)``, ``"linear_3:2"`` ->
    ``("linear_3", 2)``; a key without a numeric pass suffix -> ``(key, None)``."""
    name, sep, pass_text = key.rpartition(":")
    if sep and pass_text.isdigit():
        return name, int(pass_text)
    return key, None


def name_of(key: str) -> str:
    """A key without its pass: the base label of an op label, the address of a module call."""
    return split_pass(key)[0]


def function_of(label: str) -> str:
    """The function an op label counts calls of: ``linear_3:2`` -> ``linear``."""
    return name_of(label).rpartition("_")[0]


def call_key(address: str, pass_num: int) -> str:
    """A module call's key: ``layer1.0:2`` (every call has its pass, the first too)."""
    return f"{address}:{pass_num}"


def parse_site(text: str, addresses: Iterable[str]) -> list[Site]:
    """The sites one string names: one, or one per module a glob matches. Raises
    ``SiteUnknown`` for a string that cannot name anything in a model with ``addresses``.
    (Kept per string and address list: a surface parses the same ``save=`` on every call.)"""
    return list(_parse(text, addresses if type(addresses) is tuple else tuple(addresses)))


@functools.lru_cache(maxsize=512)
def _parse(text: str, addresses: tuple[str, ...]) -> tuple[Site, ...]:
    known = [a for a in addresses if a]
    known_set = set(known)
    if _GLOB.search(text):
        matched = _matches(text, addresses)
        if not matched:
            named = transformer_name(text)
            if named is not None:
                return (Site(text, "name", named),)
            raise SiteUnknown(text, _close(text.replace("*", "0"), known))
        return tuple(Site(text, "module", a) for a in matched)
    if text in known_set:
        return (Site(text, "module", text),)
    named = transformer_name(text)
    if named is not None:
        return (Site(text, "name", named),)
    address, pass_num = split_pass(text)
    if address in known_set and pass_num is not None and pass_num >= 1:
        return (Site(text, "module", address, pass_num),)
    label = LABEL.fullmatch(text)
    if label is not None and (label["pass"] is None or int(label["pass"]) >= 1):
        return (Site(text, "op", label["base"], int(label["pass"]) if label["pass"] else None),)
    raise SiteUnknown(text, _close(text, known))


def resolve(text: str, addresses: Iterable[str], *, option: str, model_class: str, code: str,
            example: Callable[[str], str]) -> list[Site]:
    """``parse_site`` for an option (``save=``, ``edits=``): a string that names nothing
    refuses ``code`` with the closest names, each as ``example(name)``."""
    try:
        return parse_site(text, addresses)
    except SiteUnknown as exc:
        raise InputError(
            f"{option} names {text!r}, which is no op label, module address or module glob of "
            f"{model_class}", code=code,
            teach=[example(c) for c in exc.close]
            + ["list(tl.trace(model, x, save=None).modules)  # every module address",
               "[op.label for op in tl.trace(model, x, save=None)]  # every op label"]) from None


# The transformer vocabulary: the names of one block (after ``blocks.{L}.``) and of the model
BLOCK_HOOKS = (
    "hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out",
    "ln1.hook_normalized", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_rot_q",
    "attn.hook_rot_k", "attn.hook_attn_scores", "attn.hook_pattern", "attn.hook_z",
    "attn.hook_result", "ln2.hook_normalized", "mlp.hook_pre", "mlp.hook_post")
MODEL_HOOKS = ("hook_embed", "hook_pos_embed", "ln_final.hook_normalized")
# ``utils.get_act_name``'s short names (``"resid_pre.3"``, ``"pattern.3"``, ``"embed"``)
SHORT = {hook.rpartition("hook_")[2]: hook for hook in BLOCK_HOOKS if hook.count("hook_") == 1
         and not hook.startswith("ln")} | {"ln1": "ln1.hook_normalized",
                                           "ln2": "ln2.hook_normalized",
                                           "scores": "attn.hook_attn_scores"}
_NAME = re.compile(r"blocks\.(?P<layer>\d+|\*)\.(?P<hook>[a-z0-9_.*]+)")
_SHORT = re.compile(r"(?P<short>[a-z_0-9]+?)\.?(?P<layer>\d+|\*)")


def transformer_name(text: str) -> str | None:
    """The canonical transformer name (or a glob over them) that ``text`` spells, or None:
    ``blocks.3.hook_resid_pre`` as it is, ``resid_pre.3`` / ``resid_pre3`` (TransformerLens's
    ``utils.get_act_name("resid_pre", 3)``) as ``blocks.3.hook_resid_pre``, ``embed`` as
    ``hook_embed``, ``ln_final`` as ``ln_final.hook_normalized``."""
    if text in MODEL_HOOKS:
        return text
    if text in ("embed", "pos_embed"):
        return "hook_" + text
    if text in ("ln_final", "ln_final.hook_normalized", "normalized"):
        return "ln_final.hook_normalized"
    full = _NAME.fullmatch(text)
    if full is not None:
        hook = full["hook"]
        if hook in BLOCK_HOOKS or (_GLOB.search(hook) and any(
                fnmatch.fnmatchcase(h, hook) for h in BLOCK_HOOKS)):
            return text
        return None
    short = _SHORT.fullmatch(text)
    if short is not None and short["short"] in SHORT:
        return f"blocks.{short['layer']}.{SHORT[short['short']]}"
    return None


def transformer_names(layers: int) -> list[str]:
    """Every name of the vocabulary for a model of ``layers`` blocks, in forward order."""
    return [MODEL_HOOKS[0], MODEL_HOOKS[1],
            *(f"blocks.{layer}.{hook}" for layer in range(layers) for hook in BLOCK_HOOKS),
            MODEL_HOOKS[2]]


@functools.lru_cache(maxsize=256)
def match_names(pattern: str, layers: int) -> tuple[str, ...]:
    """The names of a ``layers``-block model that a canonical name or name glob matches (``*``
    within one part), in forward order."""
    names = transformer_names(layers)
    if not _GLOB.search(pattern):
        return tuple(n for n in names if n == pattern)
    regex = re.compile("".join("[^.]*" if p == "*" else re.escape(p)
                               for p in re.split(r"(\*)", pattern)))
    return tuple(n for n in names if regex.fullmatch(n))


def expand_globs(texts: list[str], addresses: Iterable[str]) -> list[str]:
    """``texts`` with each glob replaced by the module addresses it matches (in model order);
    other strings as they are. A glob that matches nothing stays, for the caller to refuse."""
    known = addresses if type(addresses) is tuple else tuple(addresses)
    out: dict[str, None] = {}
    for text in texts:
        for name in (_matches(text, known) if _GLOB.search(text) else ()) or [text]:
            out[name] = None
    return list(out)


@functools.lru_cache(maxsize=512)
def _matches(glob: str, addresses: tuple[str, ...]) -> tuple[str, ...]:
    """The addresses a module-address glob matches, in model order."""
    pattern = _glob(glob)
    return tuple(a for a in addresses if a and pattern.fullmatch(a))


def _glob(text: str) -> re.Pattern:
    """A module-address glob as a regex: ``*`` within one part, ``**`` across parts."""
    parts = re.split(r"(\*\*|\*|\?)", text)
    wild = {"**": ".*", "*": "[^.]*", "?": "[^.]"}
    return re.compile("".join(wild.get(p) or fnmatch.translate(p)[4:-3] for p in parts))


def _close(text: str, known: list[str]) -> list[str]:
    return difflib.get_close_matches(text, known, n=3, cutoff=0.5)


def nearest_labels(label: str, labels: Iterable[str]) -> list[str]:
    """The op labels of a forward nearest to one it did not produce."""
    return difflib.get_close_matches(label, list(labels), n=3, cutoff=0.4)
