"""Transformer names on a Trace: ``trace["blocks.3.attn.hook_z"]``, and the part that keeps the
values a name derives from its anchor call (attention scores and patterns of a fused kernel).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from torch import Tensor

from .. import capabilities
from ..capture.seam import Part, whole_call
from ..errors import CaptureError, LookupFailed, TorchLensError
from ..sites import Site, name_of, split_pass, transformer_name
from ..units import format_shape
from .bind import Bound, as_sites, expand, names_in, probe, structure_of


class Named:
    """One transformer name on a trace: its value in TransformerLens's layout (``out``), and
    the op it resolved to (``label``)."""

    __slots__ = ("name", "label", "lens", "_trace", "_value")

    def __init__(self, bound: Bound, trace: Any, value: Tensor | None = None):
        self.name, self.label, self.lens = bound.name, bound.label, bound.lens
        self._trace, self._value = trace, value

    @property
    def saved(self) -> bool:
        """Whether the value can be read."""
        if self.lens.derived:
            return self._value is not None
        return self._trace[self.label].saved

    @property
    def out(self) -> Tensor:
        """The value, in TransformerLens's layout (a view of the anchor's saved value where
        the lens is one)."""
        if self.lens.derived:
            if self._value is None:
                raise TorchLensError(
                    f"{self.name!r} is computed from {self.label}'s arguments during the capture, "
                    "and this capture did not ask for it",
                    code="activation_not_saved",
                    teach=[f"tl.trace(model, x, save=[{self.name!r}])"])
            return self._value
        op = self._trace[self.label]
        if not op.saved:
            raise TorchLensError(f"{self.name!r} ({self.label}) has no saved activation",
                                 code="activation_not_saved",
                                 teach=[f"tl.trace(model, x, save=[{self.name!r}])",
                                        "tl.trace(model, x, save='all')"])
        value = op.out
        return self.lens.read(value[0] if isinstance(value, tuple) else value)

    @property
    def grad(self) -> Tensor:
        """The gradient of ``trace.backward``'s target with respect to this name's value, in
        its layout (the name must be among ``save_grads=``)."""
        if self.lens.derived:
            raise TorchLensError(f"{self.name!r} is computed for reading; it has no gradient of "
                                 "its own", code="grads_unavailable",
                                 teach=["tl.trace(model, x, save_grads=['blocks.0.attn.hook_z'])"])
        grad = self._trace[self.label].grad
        return self.lens.read(grad[0] if isinstance(grad, tuple) else grad)

    @property
    def shape(self) -> list[int] | None:
        try:
            return list(self.out.shape)
        except TorchLensError:
            return None

    def __repr__(self) -> str:
        shape = format_shape(self.shape) if self.saved else "not saved"
        return f"<Named {self.name} -> {self.label}: {shape}>"


class Names(Part):
    """Keeps the derived values of bound names as their anchor calls run (computed only for
    the names asked for), and puts every bound name on the trace."""

    def __init__(self, bound: list[Bound]):
        self.bound = bound
        self.derived: dict[str, list[Bound]] = {}
        for b in bound:
            if b.lens.derived:
                self.derived.setdefault(name_of(b.label), []).append(b)
        self.ops = set(self.derived)
        self.values: dict[str, Tensor] = {}
        self.whole: Any = None  # the capture's ``Session.whole`` (``start``)

    @classmethod
    def of(cls, *parts: Names | None) -> Names | None:
        """One part for the names of several (None when none has any)."""
        bound = {b.name: b for part in parts if part is not None for b in part.bound}
        return cls(list(bound.values())) if bound else None

    def start(self, session: Any) -> None:
        self.values.clear()
        self.whole = session.whole

    def op(self, out: Any, label: str, base: str, pass_num: int, frame: Any, func: str,
           args: tuple, kwargs: dict, index: int | None, inplace: bool) -> Any:
        for b in self.derived.get(base, ()):
            if split_pass(b.label)[1] in (None, pass_num):
                call = whole_call(self.whole, args, kwargs)  # (a sharded model's: whole)
                self.values[b.name] = b.lens.read(out, *call).detach().clone()
        return out

    def finish(self, trace: Any, session: Any) -> None:
        table = trace._objects.setdefault("names", {})
        for b in self.bound:  # what a Named is made of, not one: it holds the trace, and the
            table[b.name] = (b, self.values.get(b.name))  # trace it would be a cycle
        trace.meta.setdefault("names", {}).update({b.name: b.label for b in self.bound})


@capabilities.provide("transformer_name")
def lookup(trace: Any, key: str) -> Named:
    """``trace[name]`` for a transformer name: bound now from the trace's own graph when the
    capture did not bind it (its value is the anchor's saved value, read through the lens)."""
    table = trace._objects.setdefault("names", {})
    found = table.get(key)
    if found is not None:
        return Named(found[0], trace, found[1])
    canonical = transformer_name(key)
    if canonical is None:
        raise LookupFailed(f"{key!r} is no transformer name", code="key_not_found",
                           teach=["tl.transformer(trace).names"])
    found = table.get(canonical)
    if found is not None:
        return Named(found[0], trace, found[1])
    model = trace._objects.get("model")
    if model is None:
        raise LookupFailed(f"{key!r}: names are read from the model's structure, and this trace "
                           "holds no model (a loaded trace)", code="key_not_found",
                           teach=[f"tl.trace(model, x, save=[{key!r}])[{key!r}]"])
    bound = expand(canonical, structure_of(model, trace), model)
    if len(bound) != 1:
        raise LookupFailed(f"{key!r} names {len(bound)} values; look one up at a time",
                           code="key_not_found", teach=[f"trace[{bound[0].name!r}]"])
    table[canonical] = (bound[0], None)
    return Named(bound[0], trace)


@capabilities.provide("has_transformer_names")
def has_names(save: Any, edits: Any, inv: Any) -> bool:
    """Whether ``save=`` or ``edits=`` names a transformer name (checked without a forward)."""
    addresses = inv.addresses
    return bool(names_in(save, addresses) or (
        isinstance(edits, Mapping) and names_in(list(edits), addresses)))


@capabilities.provide("bind_transformer_names")
def bind_request(model: Any, args: tuple, kwargs: dict, inv: Any, save: Any,
                 edits: Any) -> tuple[Any, dict[str, list[Any]], Names | None]:
    """A surface's ``save=`` and ``edits=`` with their transformer names bound: (``save`` with
    each name replaced by its anchor op, ``{edit site text: sites}`` for the edit plan, the
    part that puts the names on the trace), or ``(save, {}, None)`` when neither names one.
    The structure comes from one metadata-only capture of these inputs (kept)."""
    addresses = inv.addresses
    saved = names_in(save, addresses)
    edited = names_in(list(edits), addresses) if isinstance(edits, Mapping) else []
    if not saved and not edited:
        return save, {}, None
    structure = probe(model, args, kwargs, inv)
    bound: dict[str, Bound] = {}
    new_save = save
    if saved:
        new_save = [save] if isinstance(save, str) else list(save)
    for text in saved:
        found = expand(text, structure, model)
        new_save.remove(text)
        for b in found:
            bound[b.name] = b
            if not b.lens.derived and b.label not in new_save:
                new_save.append(b.label)
    sites = {}
    for text in edited:
        found = expand(text, structure, model)
        for b in found:
            bound.setdefault(b.name, b)
        sites[text] = as_sites(found, text)
    return new_save, sites, Names(list(bound.values()))


def expand_names(model: Any, args: tuple, kwargs: dict, inv: Any, texts: list[str]) -> list[str]:
    """``texts`` with each transformer name or name glob replaced by the canonical names it
    spells that the architecture has (other sites as they are)."""
    addresses = inv.addresses
    names = set(names_in(texts, addresses))
    if not names:
        return list(texts)
    structure = probe(model, args, kwargs, inv)
    out: dict[str, None] = {}
    for text in texts:
        for name in ([b.name for b in expand(text, structure, model)] if text in names
                     else [text]):
            out[name] = None
    return list(out)


def name_sites(model: Any, args: tuple, kwargs: dict, inv: Any,
               texts: list[str]) -> dict[str, list[Site]]:
    """The edit-plan sites of the transformer names among ``texts`` (``{text: sites}``)."""
    return bind_request(model, args, kwargs, inv, None, dict.fromkeys(texts))[1]


class NameTaps:
    """A light capture's transformer names (``tl.record``): the anchors kept raw, each name
    then read through its lens (derived ones as their calls run) and kept as the caller keeps
    values, under the name."""

    def __init__(self, model: Any, args: tuple, kwargs: dict, inv: Any, save: list[str]):
        addresses = inv.addresses
        names = set(names_in(save, addresses))
        structure = probe(model, args, kwargs, inv)
        self.bound = [b for text in save if text in names
                      for b in expand(text, structure, model)]
        self.part = Names(self.bound)
        self.plain = [text for text in save if text not in names]
        # an anchor that is a module's whole output is kept from that module's frame: with no
        # op label to count, the capture runs no per-op mode (a block's hook_resid_post)
        self.sites = {b.label: structure.outputs.get(b.label, (b.label, None))
                      for b in self.bound if not b.lens.derived}
        self.anchors = {site for site, _ in self.sites.values()} - set(self.plain)
        self.save = self.plain + sorted(self.anchors)

    def keep(self, keeper: Any) -> Any:
        """The capture's keep: anchors raw, the rest as ``keeper`` keeps them."""
        def keep(key: str, value: Any) -> Any:
            if name_of(key) in self.anchors:
                return value.detach().clone() if isinstance(value, Tensor) else value
            return keeper(key, value)
        return keep

    def values(self, raw: dict[str, Any], keeper: Any) -> dict[str, Any]:
        """The kept values with each name's value in place of its raw anchor. A value that is
        already the capture's own copy (a derived one, or the whole of an anchor no other name
        reads) is handed to ``keeper`` as ``owned``: not copied again."""
        out = {k: v for k, v in raw.items() if name_of(k) not in self.anchors}
        by_name = {name_of(k): v for k, v in raw.items()}
        readers = Counter(self.sites[b.label][0] for b in self.bound if not b.lens.derived)
        for b in self.bound:
            if b.lens.derived:
                value = self.part.values.get(b.name)
                owned = True
            else:
                site, shape = self.sites[b.label]
                kept = by_name.get(site)
                if kept is None:
                    continue
                value = b.lens.read(_anchor_value(kept, shape))
                owned = isinstance(kept, Tensor) and readers[site] == 1 and \
                    value.data_ptr() == kept.data_ptr() and value.numel() == kept.numel()
            if value is not None:
                out[b.name] = keeper(b.name, value, owned=owned)
        return out


def _anchor_value(value: Any, shape: list | None) -> Tensor:
    """The anchor's tensor among what was kept: an op's first output, or the one tensor of a
    module's output of the anchor's shape (a module may return a tensor no op made as well)."""
    if isinstance(value, tuple):
        return value[0]
    if isinstance(value, list):  # a module's output of several tensors
        found = [t for t in value if isinstance(t, Tensor) and list(t.shape) == shape]
        if len(found) != 1:
            raise CaptureError(
                f"a module's output holds {len(found)} tensors of its anchor's shape {shape}",
                code="site_not_in_architecture",
                teach=["tl.trace(model, x, save=[...])  # the full capture reads the op itself"])
        return found[0]
    return value
