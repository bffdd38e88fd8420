"""An edit plan: ``edits={site: edit}`` resolved against one model before any forward, applied
through the capture's seam, and the proof of what fired.

The recorder calls ``op`` for ops whose base label the plan names (labels are made during the
forward only when a plan names op sites); the module boundaries call ``module`` for calls of
the modules it names. Both run with torch functions off, so an edit adds no op to the trace,
and both re-register the edited tensor as the op's output, so the graph and the saved values
follow the edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch._C import DisableTorchFunction

from ..capture.boundaries import leaves
from ..capture.inventory import Inventory
from ..capture.seam import Part, whole_call
from ..errors import (
    EditError,
    InputError,
    InputTypeError,
    TorchLensError,
    first_line,
    surface_call,
)
from ..sites import Site, call_key, nearest_labels, resolve
from ..units import format_shape
from .values import Edit, Where, as_edit, edit_error, fit, fitted_index, index_text


class EditPlan(Part):
    """Resolved edits of one call: op sites by base label, module sites by address."""

    def __init__(self, edits: Mapping, inv: Any, model: Any, *, allow_unfired: bool = False,
                 surface: str = "trace", named: Mapping[str, list[Site]] | None = None):
        if not isinstance(edits, Mapping):
            raise InputTypeError(f"edits= takes a mapping {{site: edit}}, not "
                                 f"{type(edits).__name__}", code="edit_invalid",
                                 teach=[surface_call(surface, "edits={'relu_3': "
                                                             "tl.edits.zero()}")])
        self.surface, self.allow_unfired = surface, allow_unfired
        self._whole: Any = None  # the capture's ``Session.whole`` (``start``)
        self.model_class = type(model).__name__
        self.param_shapes = {name: list(p.shape) for name, p in inv.params}
        addresses = inv.addresses
        self.entries: list[tuple[Site, Edit]] = []
        for text, value in edits.items():
            if not isinstance(text, str):
                raise InputTypeError(f"an edit's site is a string, not {text!r}",
                                     code="edit_invalid",
                                     teach=[surface_call(surface, "edits={'relu_3': "
                                                                 "tl.edits.zero()}")])
            edit = as_edit(value)
            sites = (named or {}).get(text) or resolve(
                text, addresses, option="edits=", model_class=self.model_class,
                code="edit_site_unknown",
                example=lambda c: surface_call(surface, f"edits={{{c!r}: ...}}"))
            for site in sites:
                if site.kind == "name":
                    raise InputError(
                        f"edits= names {text!r}, a transformer name, on a surface that does "
                        "not bind transformer names yet", code="edit_site_unknown",
                        teach=[surface_call(surface, "edits={'<op label or module "
                                                     "address>': ...}"),
                               f"tl.trace(model, x, edits={{{text!r}: ...}})  # tl.trace "
                               "binds transformer names"])
                if site.lens is not None and not site.lens.editable:
                    raise InputError(
                        f"{text!r} is derived from the capture for reading (each head's "
                        "share of the output); it has no tensor of the model's to edit",
                        code="edit_name_read_only",
                        teach=[surface_call(surface, "edits={'blocks.0.attn.hook_z': "
                                                     "tl.edits.zero(head=3)}")
                               + "  # edit the heads' values"])
                _check_head(edit, site, text, surface)
                edit.check(site.lens.name if site.lens is not None else
                           site.text if site.kind == "op" else site.name, self)
                self.entries.append((site, edit))
        self.ops: dict[str, list[tuple[Site, Edit]]] = {}
        self.modules: dict[str, list[tuple[Site, Edit]]] = {}
        for site, edit in self.entries:
            table = self.ops if site.kind == "op" else self.modules
            table.setdefault(site.name, []).append((site, edit))
        self.fired: list[dict[str, Any]] = []
        self.norms: list[Tensor] = []
        self._held = [m for _, m in inv.modules]  # whose buffers a refusal puts back
        self._undo: tuple | None = None
        self._refused = False

    # ---- checks before the forward --------------------------------------------------------
    def check_source(self, source: Any, site: str) -> None:
        """A patch or mean source: a trace of this model that holds a value at ``site``."""
        shapes = {name: p["shape"] for name, p in source.params.items()}
        if source.meta.get("model_class") != self.model_class or shapes != self.param_shapes:
            raise InputError(
                f"the source trace is of {source.meta.get('model_class')} with other "
                f"parameters than this {self.model_class}: its values cannot stand in here",
                code="edit_source_model_mismatch",
                teach=["clean = tl.trace(model, clean_x, save=[...])  # the same model"])
        try:
            target = source[site]
        except TorchLensError:
            target = None
        saved = False
        if target is not None:
            if hasattr(target, "saved"):
                saved = target.saved
            else:
                calls = getattr(target, "calls", None) or [target]
                saved = all(_call_saved(c) for c in calls)
        if not saved:
            raise InputError(
                f"the source trace holds no value at {site!r}", code="edit_source_missing",
                teach=[f"clean = tl.trace(model, clean_x, save=[{site!r}])",
                       "clean = tl.trace(model, clean_x, save='all')"])

    # ---- the seam ---------------------------------------------------------------------------
    def op(self, out: Any, label: str, base: str, pass_num: int, frame: list, func: str,
           args: tuple, kwargs: dict, index: int, inplace: bool) -> Any:
        """The recorder's seam: ``out`` with every edit of this op's site applied."""
        for site, edit in self.ops.get(base, ()):
            if site.pass_num is None or site.pass_num == pass_num:
                inputs = [a for a in args if isinstance(a, Tensor)]
                where = Where(site.text, label, base, pass_num, frame[0], func, None, inputs,
                              site.lens.name if site.lens is not None else label)
                derived = site.lens is not None and site.lens.derived
                out = self._apply(edit, out, where, index, inplace, lens=site.lens,
                                  call=whole_call(self._whole, args, kwargs) if derived
                                  else (args, kwargs))
        return out

    def module(self, state: Any, address: str, pass_num: int, args: tuple, output: Any) -> Any:
        """The module boundary's seam: the call's output with its edits applied, the edited
        tensor re-registered as its producing op's output."""
        for site, edit in self.modules[address]:
            if site.pass_num is not None and site.pass_num != pass_num:
                continue
            with DisableTorchFunction():
                inputs = leaves(args, [])
                key = call_key(address, pass_num)  # the call: a module may run several times
                where = Where(site.text, None, None, pass_num, address, None, None, inputs, key)
                before = _pick(output, edit.item, where)
                made = state.made_by(before)
                producer = made[0] if made is not None else None
                output = self._apply(edit, output, where, producer, inplace=False)
                after = _pick(output, edit.item, where)
                if made is not None and after is not before:
                    state.substitute(producer, made[1], after)
        return output

    def _apply(self, edit: Edit, out: Any, where: Where, index: int | None,
               inplace: bool, item: Any = ..., lens: Any = None, call: tuple = ((), {})) -> Any:
        """``out`` with ``edit`` applied (``_edit``); a refusal is noted, so the forward's
        state is put back when it ends."""
        try:
            return self._edit(edit, out, where, index, inplace, item, lens, call)
        except TorchLensError:
            self._refused = True
            raise

    def _edit(self, edit: Edit, out: Any, where: Where, index: int | None,
              inplace: bool, item: Any, lens: Any, call: tuple) -> Any:
        """``out`` with ``edit`` applied to its ``item`` (default: the edit's own); through
        ``lens`` (a transformer name's view of the op's output, read from its ``call``)."""
        item = edit.item if item is ... else item
        anchor = _pick(out, item, where)
        value = anchor if lens is None else lens.read(anchor, *call)
        where.shape = list(value.shape)
        where_index = where.index = _index(edit, lens)
        part = value if where_index is None else self._part(value, where_index, edit, lens,
                                                             where)
        try:
            new = edit.new(part, where)
            if tuple(new.shape) != tuple(part.shape) or new.dtype != part.dtype:
                new = fit(new, part, where).expand(part.shape)
        except EditError as err:
            raise self._taught(err, edit, where, part) from None
        change = (new.detach().double() - part.detach().double()).norm()
        if where_index is not None:
            whole = value.clone()
            whole[where_index] = new
            new = whole
        if lens is not None:
            new = lens.write(anchor, new, *call)
        if inplace:  # the op wrote its input: the edit writes it too, where readers look
            anchor.copy_(new)
            result = out
        else:
            result = _put(out, item, new, where)
        self.norms.append(change)
        self.fired.append({
            "site": where.site, "label": where.label, "pass": where.pass_num,
            "module": where.module, "op_index": index, "kind": edit.kind,
            "shape": where.shape, "index": index_text(where_index), "item": edit.item
            if isinstance(edit.item, (int, str)) or edit.item is None else repr(edit.item),
        })
        return result

    def _part(self, value: Tensor, index: Any, edit: Edit, lens: Any, where: Where) -> Tensor:
        """``value[index]``; an index the value's shape does not have refuses typed
        (``edit_index_out_of_range``), teaching the call with the index brought in range."""
        try:
            return value[index]
        except IndexError as exc:
            fitted, wrong = fitted_index(index, value.shape)
            fitted, head = _split_head(fitted, edit, lens)
            site = where.site
            if wrong:
                axis, item, size = wrong[0]
                said = f"{index_text((item,))[1:-1]} is past the end of axis {axis} (size " \
                    f"{size})" if size else f"the value has no axis {axis}"
                if edit.head is not None and lens is not None and axis == lens.head_axis:
                    said += f": head= takes heads 0 to {size - 1}"
            else:
                said = first_line(exc)
            raise EditError(
                f"the edit at {site!r} ({where.label or where.key}) indexes "
                f"{index_text(index)}, but the value there has shape "
                f"{format_shape(value.shape)}: {said}",
                code="edit_index_out_of_range",
                teach=[surface_call(self.surface, f"edits={{{site!r}: "
                                                  f"{edit.code(fitted, head)}}}"),
                       f"tl.trace(model, x, save=[{site!r}])[{site!r}].out.shape  # the "
                       "value's shape there"]) from None
        except (TypeError, ValueError, RuntimeError) as exc:
            raise edit_error("edit_invalid", where,
                             f"index={index_text(index)} cannot index the value at "
                             f"{where.site!r} (shape {format_shape(value.shape)}): "
                             f"{first_line(exc)}") from None

    def _taught(self, err: EditError, edit: Edit, where: Where, part: Tensor) -> EditError:
        """An edit's refusal of a value that does not fit, its teach led by the user's call
        with the value it needs."""
        if err.code not in ("edit_shape_mismatch", "edit_dtype_mismatch") or \
                edit.kind not in ("add", "replace", "mean", "patch") or \
                self.surface in ("patching.sweep", "attribution"):  # no edits= of the user's
            return err
        what = edit.code().partition("(")[2].partition(",")[0].rstrip(")")  # its argument
        need = f"of shape {format_shape(part.shape)} (or one that broadcasts to it)" \
            if err.code == "edit_shape_mismatch" else f"cast to {part.dtype}"
        if what == "acts":
            need = f"rows whose mean has shape {format_shape(part.shape)}"
        elif what == "clean":
            need = "a trace of an input of the same shape"
        call = surface_call(self.surface, f"edits={{{where.site!r}: {edit.code()}}}")
        fixed = EditError(err.message, code=err.code,
                          teach=[f"{call}  # {what}: {need}", *err.teach])
        fixed.partial_trace = getattr(err, "partial_trace", None)
        return fixed

    # ---- after the forward ------------------------------------------------------------------
    def start(self, session: Any) -> None:
        """Each capture proves its own firing (a recording or a step run reuses a plan); the
        RNG streams and the buffers of modules in training mode are kept, so that a refusal
        of an edit (mid-forward, or a site that never fired) leaves them as they were."""
        self.fired.clear()
        self.norms.clear()
        self._whole = session.whole
        self._refused = False
        self._undo = _state_now(self._held)

    def _put_back(self) -> None:
        """The RNG streams and training-mode buffers as the forward found them."""
        if self._undo is not None:
            _restore_state(self._undo)
            self._undo = None

    def finish(self, trace: Any, session: Any) -> None:
        """What was asked and what fired, in the trace's meta (saved with it); a site that
        never fired refuses (unless ``allow_unfired``) once the forward ran to its end."""
        trace.meta["edits"] = {"specs": self.specs(), "fired": self.rows()}
        if session.failed and self._refused:  # an edit refused mid-forward: undo the forward
            self._put_back()
        if not session.failed:
            if not self.allow_unfired and self.unfired():
                self._put_back()  # the forward ran, but its edits did not: undo what it did
            self.refuse_unfired(trace)
        self._undo = None

    def specs(self) -> list[dict[str, Any]]:
        """What the provenance keeps: each site with its edit's description."""
        return [{"site": text, **edit.describe()} for text, edit in _by_text(self.entries)]

    def rows(self) -> list[dict[str, Any]]:
        """The firing rows (norms read now: one sync per fired edit), unfired sites last."""
        rows = []
        for row, norm in zip(self.fired, self.norms):
            row = dict(row, norm=float(norm))
            row["zero_change"] = row["norm"] == 0.0
            rows.append(row)
        fired = {row["site"] for row in rows}
        for text, edit in _by_text(self.entries):
            if text not in fired:
                rows.append({"site": text, "label": None, "pass": None, "module": None,
                             "op_index": None, "kind": edit.kind, "shape": None,
                             "index": index_text(edit.index), "item": None,
                             "norm": None, "zero_change": None, "fired": False})
        for row in rows:
            row.setdefault("fired", True)
        return rows

    def unfired(self) -> list[str]:
        """The sites of this plan that fired nowhere in the forward."""
        fired = {row["site"] for row in self.fired}
        return [text for text, _ in _by_text(self.entries) if text not in fired]

    def refuse_unfired(self, partial: Any) -> None:
        """``edit_site_not_fired`` unless ``allow_unfired``; the trace rides on the error."""
        missing = self.unfired()
        if not missing or self.allow_unfired:
            return
        labels = [op.label for op in partial.ops] if partial is not None else []
        edits = dict(_by_text(self.entries))
        close = [(m, edits[text]) for text in missing for m in nearest_labels(text, labels)]
        keep_going = "trace.push(edits, allow_unfired=True)" if self.surface == "push" else \
            surface_call(self.surface, "edits=edits, allow_unfired=True")
        err = EditError(
            f"edits at {missing} never fired: the forward produced no such op or module call",
            code="edit_site_not_fired",
            teach=[surface_call(self.surface, f"edits={{{c!r}: {edit.code()}}}")
                   for c, edit in close]
            + [keep_going + "  # keep going, and list it in trace.edits"])
        err.partial_trace = partial
        raise err


def _state_now(modules: list[nn.Module]) -> tuple:
    """The RNG streams (CPU, and CUDA where it has started) and a copy of every buffer of a
    module in training mode (the only ones a forward updates as it runs, e.g. BatchNorm's
    statistics): cheap in eval mode, where nothing is copied."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    buffers = [(b, b.detach().clone()) for m in modules if m.training
               for b in m._buffers.values() if isinstance(b, Tensor) and not b.is_meta]
    return torch.random.get_rng_state(), cuda, buffers


def _restore_state(state: tuple) -> None:
    cpu, cuda, buffers = state
    torch.random.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
    with torch.no_grad():
        for buffer, kept in buffers:
            if buffer.shape == kept.shape:
                buffer.copy_(kept)


def _check_head(edit: Edit, site: Site, text: str, surface: str) -> None:
    """``head=`` needs a site whose layout has a head axis, and an ``index`` that leaves it."""
    if edit.head is None:
        return
    axis = site.lens.head_axis if site.lens is not None else None
    if axis is None:
        raise InputError(
            f"head= at {text!r}: the value there has no head axis (head= takes an attention "
            "name: blocks.{L}.attn.hook_z, hook_q, hook_k, hook_v, hook_pattern, "
            "hook_attn_scores, hook_result)", code="edit_head_not_attention",
            teach=[surface_call(surface, f"edits={{'blocks.0.attn.hook_z': "
                                         f"{edit.code(head=3)}}}")])
    index = edit.index if isinstance(edit.index, tuple) else (
        () if edit.index is None else (edit.index,))
    if any(i is Ellipsis for i in index) or len(index) > axis and not (
            isinstance(index[axis], slice) and index[axis] == slice(None)):
        kept = tuple(i for i in index[:axis] if i is not Ellipsis)
        raise InputError(
            f"head= and index={index_text(edit.index)} at {text!r} both address axis {axis}, "
            "the head axis", code="edit_invalid",
            teach=[surface_call(surface, f"edits={{{text!r}: "
                                         f"{edit.code(index=kept or None)}}}")
                   + "  # index= up to the head axis, head= on it"])


def _index(edit: Edit, lens: Any) -> Any:
    """The edit's index in its value's layout, with ``head=`` on the lens's head axis."""
    if edit.head is None:
        return edit.index
    index = edit.index if isinstance(edit.index, tuple) else (
        () if edit.index is None else (edit.index,))
    axis = lens.head_axis
    padded = [*index, *([slice(None)] * (axis + 1 - len(index)))]
    padded[axis] = list(edit.head) if isinstance(edit.head, (list, tuple)) else edit.head
    return tuple(padded)


def _split_head(index: Any, edit: Edit, lens: Any) -> tuple[Any, Any]:
    """An index in the value's layout (``_index``) as the edit's own ``(index, head)``."""
    if edit.head is None or lens is None or not isinstance(index, tuple):
        return index, edit.head
    axis = lens.head_axis
    items = list(index)
    head = items[axis] if len(items) > axis else edit.head
    if len(items) > axis:
        items[axis] = slice(None)
    while items and isinstance(items[-1], slice) and items[-1] == slice(None):
        items.pop()
    if not items:
        return None, head
    return (tuple(items) if isinstance(edit.index, tuple) or len(items) > 1 else items[0]), head


def _by_text(entries: list[tuple[Site, Edit]]) -> list[tuple[str, Edit]]:
    """One (site text, edit) per key of ``edits=`` (a glob's modules are one site)."""
    seen: dict[str, Edit] = {}
    for site, edit in entries:
        seen.setdefault(site.text, edit)
    return list(seen.items())


def _call_saved(call: Any) -> bool:
    try:
        call.out  # noqa: B018  (reading it is the check)
    except TorchLensError:
        return False
    return True


def _pick(out: Any, item: Any, where: Where) -> Tensor:
    """The tensor of an output an edit touches: ``item`` (an index or key), else the first."""
    if isinstance(out, Tensor):
        if item not in (None, 0):
            raise edit_error("edit_invalid", where, f"item={item!r} at {where.site!r}: the "
                             "value is one tensor")
        return out
    if item is None:
        found = leaves(out, [])
        if not found:
            raise edit_error("edit_invalid", where, f"the output at {where.site!r} holds no "
                             "tensor to edit")
        return found[0]
    try:
        value = out[item]
    except (KeyError, IndexError, TypeError):
        raise edit_error("edit_invalid", where,
                         f"item={item!r} names nothing in the output at {where.site!r} "
                         f"({type(out).__name__})") from None
    if not isinstance(value, Tensor):
        raise edit_error("edit_invalid", where, f"item={item!r} at {where.site!r} is "
                         f"{type(value).__name__}, not a tensor")
    return value


def _put(out: Any, item: Any, new: Tensor, where: Where) -> Any:
    """``out`` with the tensor ``_pick`` chose replaced by ``new``."""
    if isinstance(out, Tensor):
        return new
    old = _pick(out, item, where)
    return _swap(out, old, new, 0)


def _swap(value: Any, old: Tensor, new: Tensor, depth: int) -> Any:
    if value is old:
        return new
    if depth > 6:
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_swap(v, old, new, depth + 1) for v in value)
    if isinstance(value, list):
        return [_swap(v, old, new, depth + 1) for v in value]
    if isinstance(value, Mapping):  # a model-output object keeps its class and attributes
        for key in list(value.keys()):
            swapped = _swap(value[key], old, new, depth + 1)
            if swapped is not value[key]:
                value[key] = swapped
        return value
    if hasattr(value, "_fields"):
        return type(value)(*(_swap(v, old, new, depth + 1) for v in value))
    return value


def plan_edits(edits: Any, inv: Inventory, model: nn.Module, allow_unfired: bool,
               surface: str, named: Mapping[str, list[Site]] | None = None) -> EditPlan | None:
    """``edits=`` resolved before any forward runs (None: no edits, the unedited capture);
    ``named``: transformer names among its sites, already bound."""
    if edits is None:
        return None
    return EditPlan(edits, inv, model, allow_unfired=allow_unfired, surface=surface,
                    named=named)
