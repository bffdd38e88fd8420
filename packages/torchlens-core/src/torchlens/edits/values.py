"""Edits are values: what to do to a site's output, with an optional ``index`` and ``item``.

Each edit makes the new value of the part it touches (``new(part, where)``); the plan puts it
back into the whole value, so nothing outside ``index`` changes. ``describe()`` is what the
trace's provenance keeps: the kind, the index, shapes and a hash of any tensor argument.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ..errors import EditError, InputError, InputTypeError
from ..trace import Trace
from ..units import format_shape


class Where:
    """What an edit is told about the place it fires: the op label, its pass, its module, the
    value's shape, and the input of a module call (for ``skip``). Passed to callables as ``op``."""

    __slots__ = ("site", "label", "base_label", "pass_num", "module", "func", "shape", "inputs",
                 "key", "index")

    def __init__(self, site, label, base_label, pass_num, module, func, shape, inputs, key):
        self.site, self.label, self.base_label, self.pass_num = site, label, base_label, pass_num
        self.module, self.func, self.shape, self.inputs = module, func, shape, inputs
        self.key = key  # what another trace is looked up by for the same place
        self.index = None  # the part the edit touches, ``head=`` included (set as it fires)

    def __repr__(self) -> str:
        return f"<site {self.site!r} at {self.label} (pass {self.pass_num}) in {self.module!r}>"


def tensor_hash(t: Tensor) -> str:
    """A short sha256 of a tensor's bytes, for provenance (read in place, no numpy needed)."""
    import ctypes

    data = t.detach().cpu()
    if data.is_complex():
        data = torch.view_as_real(data)
    data = data.contiguous().reshape(-1).view(torch.uint8)
    raw = ctypes.string_at(data.data_ptr(), data.numel()) if data.numel() else b""
    return hashlib.sha256(raw).hexdigest()[:16]


def index_text(index: Any) -> str | None:
    if index is None:
        return None
    items = index if isinstance(index, tuple) else (index,)
    parts = []
    for i in items:
        if isinstance(i, slice):
            parts.append(":".join("" if v is None else str(v) for v in (i.start, i.stop))
                         + ("" if i.step is None else f":{i.step}"))
        elif i is Ellipsis:
            parts.append("...")
        elif isinstance(i, Tensor):
            parts.append(f"tensor{list(i.shape)}")
        else:
            parts.append(repr(i))
    return "[" + ", ".join(parts) + "]"


def index_code(index: Any) -> str:
    """An index as the Python a user writes for it: ``(slice(None), 3)``, ``[0, 2]``, ``...``."""
    if isinstance(index, tuple):
        items = [index_code(i) for i in index]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(index, slice):
        bounds = [index.start, index.stop] + ([index.step] if index.step is not None else [])
        return "slice(" + ", ".join(repr(v) for v in (
            bounds if bounds != [None, None] else [None])) + ")"
    if index is Ellipsis:
        return "..."
    if isinstance(index, Tensor):
        return f"torch.tensor({index.tolist()!r})" if index.numel() <= 8 else "idx"
    return repr(index)


def fitted_index(index: Any, shape: Any) -> tuple[Any, list[tuple[int, Any, int]]]:
    """``index`` made to fit a value of ``shape`` -- each int (or int in a list or an integer
    tensor) past the end of its axis brought to the axis's last entry, indices past the last
    axis dropped (None: nothing left, the whole value) -- and what did not fit, as (axis, the
    index there, the axis's size; size 0 for an axis the value does not have). What a teach
    offers for an index out of range."""
    items = list(index) if isinstance(index, tuple) else [index]
    ndim = len(shape)

    def takes(item: Any) -> bool:  # an index that uses up one axis
        return item is not None and item is not Ellipsis and not isinstance(item, bool)

    out: list[Any] = []
    wrong: list[tuple[int, Any, int]] = []
    dim = 0
    for k, item in enumerate(items):
        if item is Ellipsis:
            out.append(item)
            dim = max(dim, ndim - sum(1 for i in items[k + 1:] if takes(i)))
        elif not takes(item):
            out.append(item)
        elif dim < ndim:
            fitted = _fit_entry(item, shape[dim])
            if fitted is not item:
                wrong.append((dim, item, shape[dim]))
            out.append(fitted)
            dim += 1
        else:
            wrong.append((dim, item, 0))
            dim += 1
    if not out:
        return None, wrong
    return (tuple(out) if isinstance(index, tuple) or len(out) != 1 else out[0]), wrong


def _fit_entry(item: Any, size: int) -> Any:
    """One axis's index within ``size`` entries (``item`` itself where it fits)."""
    last = max(size - 1, 0)
    if isinstance(item, int):
        return item if -size <= item < size else (last if item >= 0 else -max(size, 1))
    if isinstance(item, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                      for i in item):
        if all(-size <= i < size for i in item):
            return item
        return list(dict.fromkeys(_fit_entry(i, size) for i in item))
    if isinstance(item, Tensor) and not item.is_floating_point() and item.dtype != torch.bool:
        if not item.numel() or bool(((item >= -size) & (item < size)).all()):
            return item
        return item.clamp(-max(size, 1), last)
    return item


def edit_error(code: str, where: Where | None, message: str,
               teach: list[str] | None = None) -> EditError:
    """An ``EditError`` whose teach shows the value's shape at ``where``'s site."""
    site = where.site if where is not None else "site"
    return EditError(message, code=code, teach=teach or [
        f"trace = tl.trace(model, x, save=[{site!r}]); trace[{site!r}].out.shape  "
        "# the value's shape there"])


class Edit(ABC):
    """Base of every edit. ``index`` selects the part of the value it touches (positions, a
    head after the reshape that splits heads, a channel); ``item`` which tensor of a module's
    tuple or model-output object (default: the first)."""

    kind = "edit"

    def __init__(self, *, index: Any = None, item: Any = None, head: Any = None):
        if index is not None and not (_index_item(index) or isinstance(index, (tuple, list))
                                      and all(_index_item(i) for i in index)
                                      and sum(i is Ellipsis for i in index) <= 1):
            raise InputTypeError(
                f"index= takes what tensor indexing takes (an int, a slice, a tuple of them), "
                f"not {index!r}", code="edit_invalid",
                teach=["tl.edits.zero(index=(slice(None), 4))  # every batch row, position 4"])
        if head is not None and not (isinstance(head, int) or isinstance(head, (list, tuple))
                                     and all(isinstance(h, int) and not isinstance(h, bool)
                                             for h in head)) \
                or isinstance(head, bool):
            raise InputTypeError(f"head= takes a head number or a list of them, not {head!r}",
                                 code="edit_invalid",
                                 teach=["tl.edits.zero(head=3)", "tl.edits.zero(head=[0, 5])"])
        self.index = tuple(index) if isinstance(index, list) else index
        self.item = item
        self.head = list(head) if isinstance(head, tuple) else head

    @abstractmethod
    def new(self, part: Tensor, where: Where) -> Tensor:
        """The edited value of ``part`` (the value, or its ``index``ed part)."""

    def check(self, site: str, plan: Any) -> None:  # noqa: B027  (most edits need no check)
        """Refusals that need no forward (a patch source missing the site, say)."""

    def code(self, index: Any = ..., head: Any = ...) -> str:
        """The edit as the Python that makes it (``tl.edits.zero(index=(slice(None), 3))``),
        with ``index`` and ``head`` put in place of its own where given: what a teach writes."""
        index = self.index if index is ... else index
        head = self.head if head is ... else head
        args = [a for a in (self._args_code(),
                            None if index is None else f"index={index_code(index)}",
                            None if head is None else f"head={head!r}",
                            None if self.item is None else f"item={self.item!r}") if a]
        return f"tl.edits.{self.kind}({', '.join(args)})"

    def _args_code(self) -> str:
        return ""

    def describe(self) -> dict[str, Any]:
        """The edit as plain data (kind, index, shapes, a hash of a tensor argument): what
        provenance keeps."""
        out: dict[str, Any] = {"kind": self.kind, "index": index_text(self.index)}
        if self.head is not None:
            out["head"] = self.head
        if self.item is not None:
            out["item"] = self.item if isinstance(self.item, (int, str)) else repr(self.item)
        out.update(self._facts())
        return out

    def _facts(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        facts = {k: v for k, v in self.describe().items() if v is not None and k != "kind"}
        return f"tl.edits.{self.kind}({', '.join(f'{k}={v!r}' for k, v in facts.items())})"


def _index_item(item: Any) -> bool:
    """What one axis of an index takes: an int, a slice of ints, ``...``, None (a new axis), a
    list of ints, an integer or boolean tensor."""
    if isinstance(item, bool):
        return False
    if isinstance(item, (int, type(None))) or item is Ellipsis:
        return True
    if isinstance(item, slice):
        return all(v is None or isinstance(v, int) and not isinstance(v, bool)
                   for v in (item.start, item.stop, item.step)) and \
            (item.step is None or item.step > 0)  # torch takes no negative step
    if isinstance(item, list):
        return all(isinstance(i, int) and not isinstance(i, bool) for i in item)
    if isinstance(item, Tensor):
        return not item.is_floating_point() and not item.is_complex()
    return False


class _Zero(Edit):
    kind = "zero"

    def new(self, part, where):
        return torch.zeros_like(part)


class _Scale(Edit):
    kind = "scale"

    def __init__(self, k: float, **kw):
        super().__init__(**kw)
        if isinstance(k, Tensor) or not isinstance(k, (int, float)) or isinstance(k, bool):
            raise InputTypeError(f"tl.edits.scale takes a number, not {k!r}", code="edit_invalid",
                                 teach=["tl.edits.scale(0.5)"])
        self.k = float(k)

    def new(self, part, where):
        return part * self.k

    def _args_code(self):
        return repr(self.k)

    def _facts(self):
        return {"k": self.k}


class _TensorEdit(Edit):
    """An edit holding one tensor argument, checked to be a tensor up front."""

    def __init__(self, tensor: Tensor, **kw):
        super().__init__(**kw)
        if not isinstance(tensor, Tensor):
            raise InputTypeError(f"tl.edits.{self.kind} takes a tensor, not "
                                 f"{type(tensor).__name__}", code="edit_invalid",
                                 teach=[f"tl.edits.{self.kind}(torch.tensor(...))"])
        if tensor.is_meta:
            raise InputError(f"tl.edits.{self.kind} got a meta tensor, which holds no values",
                             code="edit_invalid", teach=[f"tl.edits.{self.kind}(real_tensor)"])
        self.tensor = tensor.detach()

    def _facts(self):
        return {"shape": list(self.tensor.shape), "dtype": str(self.tensor.dtype).removeprefix(
            "torch."), "sha256": tensor_hash(self.tensor)}


class _Add(_TensorEdit):
    kind = "add"

    def __init__(self, vector: Tensor, alpha: float = 1.0, **kw):
        super().__init__(vector, **kw)
        if isinstance(alpha, (bool, Tensor)) or not isinstance(alpha, (int, float)):
            raise InputTypeError(f"tl.edits.add's alpha= takes a number, not {alpha!r}",
                                 code="edit_invalid", teach=["tl.edits.add(vector, alpha=2.0)"])
        self.alpha = float(alpha)

    def new(self, part, where):
        return part + self.alpha * fit(self.tensor, part, where)

    def _args_code(self):
        return "vector" + ("" if self.alpha == 1.0 else f", alpha={self.alpha!r}")

    def _facts(self):
        return {**super()._facts(), "alpha": self.alpha}


class _Replace(_TensorEdit):
    kind = "replace"

    def __init__(self, tensor: Tensor, **kw):
        super().__init__(tensor, **kw)

    def new(self, part, where):
        return fit(self.tensor, part, where).expand(part.shape).clone()

    def _args_code(self):
        return "tensor"


class _Patch(Edit):
    """The value another trace holds at the same site (same label and pass, same module call)."""

    kind = "patch"

    def __init__(self, source: Any, **kw):
        super().__init__(**kw)
        if not isinstance(source, Trace):
            raise InputTypeError(f"tl.edits.patch takes a Trace, not {type(source).__name__}",
                                 code="edit_invalid",
                                 teach=["clean = tl.trace(model, clean_x, save=['site'])",
                                        "tl.trace(model, x, edits={'site': "
                                        "tl.edits.patch(clean)})"])
        self.source = source

    def check(self, site, plan):
        plan.check_source(self.source, site)

    def _args_code(self):
        return "clean"

    def new(self, part, where):
        value = source_value(self.source, where)
        if where.index is not None:
            value = value[where.index]
        return fit(value, part, where).expand(part.shape).clone()

    def _facts(self):
        return {"source_model": self.source.meta.get("model_class"),
                "source_origin": self.source.provenance.get("origin")}


class _Mean(Edit):
    """Mean ablation: the mean of ``source`` over its rows (dimension 0): a tensor, a saved
    Trace (the mean over its batch at the same site), or a recording store and its label."""

    kind = "mean"

    def __init__(self, source: Any, label: str | None = None, **kw):
        super().__init__(**kw)
        self.source, self.label = source, label
        if isinstance(source, Tensor):
            self.value = source.detach().mean(0)
        elif callable(getattr(source, "batches", None)):  # a recording store
            if label is None:
                raise InputError("tl.edits.mean of a recording store needs the store's label",
                                 code="edit_invalid",
                                 teach=["tl.edits.mean(rec, label='transformer.h.6')"])
            self.value = _store_mean(source, label)
        elif isinstance(source, Trace):
            self.value = None  # taken at each site from the trace
        else:
            raise InputTypeError(
                f"tl.edits.mean takes a tensor, a Trace or a recording store, not "
                f"{type(source).__name__}", code="edit_invalid",
                teach=["tl.edits.mean(acts)  # a tensor of rows: the mean over dimension 0"])

    def check(self, site, plan):
        if self.value is None:
            plan.check_source(self.source, site)

    def _args_code(self):
        if self.label is not None:
            return f"rec, label={self.label!r}"
        return "acts" if self.value is not None else "clean"

    def new(self, part, where):
        value = self.value
        if value is None:
            value = source_value(self.source, where).mean(0)
        return fit(value, part, where).expand(part.shape).clone()

    def _facts(self):
        if self.value is None:
            return {"source": "trace", "source_model": self.source.meta.get("model_class")}
        return {"source": "store" if self.label else "tensor", "label": self.label,
                "shape": list(self.value.shape), "sha256": tensor_hash(self.value)}


def _store_mean(rec: Any, label: str) -> Tensor:
    total, count = None, 0
    for batch in rec.batches(label, batch_size=4096):
        batch = batch.double()
        total = batch.sum(0) if total is None else total + batch.sum(0)
        count += batch.shape[0]
    if not count:
        raise InputError(f"the store holds no rows of {label!r} to average", code="edit_invalid",
                         teach=["tl.recording.open('acts/')  # check the store's labels"])
    return (total / count).float()


class _Skip(Edit):
    """A module's output becomes its input (an op's: its first tensor input)."""

    kind = "skip"

    def new(self, part, where):
        inputs = where.inputs
        if not inputs:
            raise edit_error("edit_shape_mismatch", where,
                             f"tl.edits.skip at {where.site!r}: the call had no tensor input")
        value = inputs[0]
        if self.index is not None:
            try:
                value = value[self.index]
            except (IndexError, TypeError, ValueError, RuntimeError):
                raise edit_error("edit_shape_mismatch", where,
                                 f"tl.edits.skip at {where.site!r}: its input has shape "
                                 f"{format_shape(value.shape)}, which index="
                                 f"{index_text(self.index)} does not fit (its output has "
                                 f"{format_shape(where.shape)})") from None
        if tuple(value.shape) != tuple(part.shape):
            raise edit_error("edit_shape_mismatch", where,
                             f"tl.edits.skip at {where.site!r}: its input has shape "
                             f"{format_shape(value.shape)}, its output {format_shape(part.shape)}")
        return value


class _Call(Edit):
    kind = "callable"

    def __init__(self, fn: Callable[[Tensor, Where], Tensor], **kw):
        super().__init__(**kw)
        self.fn = fn

    def code(self, index: Any = ..., head: Any = ...) -> str:
        return f"lambda value, op: ...  # {_fn_name(self.fn)}"

    def new(self, part, where):
        out = self.fn(part, where)
        if not isinstance(out, Tensor):
            raise edit_error("edit_invalid", where,
                             f"the edit function {_fn_name(self.fn)} returned "
                             f"{type(out).__name__} at {where.label}, not a tensor")
        return out

    def _facts(self):
        return {"function": _fn_name(self.fn)}


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def fit(value: Tensor, part: Tensor, where: Where) -> Tensor:
    """``value`` on ``part``'s device and dtype, checked to broadcast to ``part``'s shape."""
    try:
        shape = torch.broadcast_shapes(value.shape, part.shape)
    except RuntimeError:
        shape = None
    if shape != part.shape:
        raise edit_error("edit_shape_mismatch", where,
                         f"the edit at {where.site!r} ({where.label or where.key}) gives shape "
                         f"{format_shape(value.shape)}, which does not fit the value's "
                         f"{format_shape(part.shape)}")
    if value.is_complex() and not part.is_complex():
        raise edit_error("edit_dtype_mismatch", where,
                         f"the edit at {where.site!r} gives {value.dtype}, which cannot be cast "
                         f"to the value's {part.dtype} without losing its imaginary part")
    cast = value.to(device=part.device, dtype=part.dtype)
    if value.dtype != part.dtype and not part.is_floating_point() and not part.is_complex() \
            and not torch.equal(cast.to(value.dtype), value.to(cast.device)):
        raise edit_error("edit_dtype_mismatch", where,
                         f"the edit at {where.site!r} gives {value.dtype} values that the "
                         f"value's {part.dtype} cannot hold (e.g. fractions in an integer "
                         "tensor)", teach=[f"edits={{{where.site!r}: tl.edits.replace("
                                           f"t.to(torch.{str(part.dtype).removeprefix('torch.')})"
                                           ")}  # cast it yourself, as you mean it"])
    return cast


def source_value(source: Any, where: Where) -> Tensor:
    """The value another trace holds at ``where`` (the plan checked it is there when it could)."""
    from ..errors import TorchLensError
    try:
        value = source[where.key].out
    except TorchLensError:
        raise edit_error("edit_source_missing", where,
                         f"the source trace has no saved value at {where.key!r}",
                         teach=[f"tl.trace(model, clean_x, save=[{where.site!r}])"]) from None
    if isinstance(value, tuple):
        value = value[0]
    return value


def zero(*, index: Any = None, item: Any = None, head: Any = None) -> Edit:
    """Zero ablation: the value (or its ``index``ed part) becomes zeros."""
    return _Zero(index=index, item=item, head=head)


def scale(k: float, *, index: Any = None, item: Any = None, head: Any = None) -> Edit:
    """Multiply the value (or its ``index``ed part) by ``k``."""
    return _Scale(k, index=index, item=item, head=head)


def add(vector: Tensor, alpha: float = 1.0,
        *, index: Any = None, item: Any = None, head: Any = None) -> Edit:
    """Steering: add ``alpha * vector``, broadcast over the value's last dimension."""
    return _Add(vector, alpha, index=index, item=item, head=head)


def replace(tensor: Tensor, *, index: Any = None, item: Any = None, head: Any = None) -> Edit:
    """The value (or its ``index``ed part) becomes ``tensor`` (broadcast to its shape)."""
    return _Replace(tensor, index=index, item=item, head=head)


def patch(other_trace: Any, *, index: Any = None, item: Any = None, head: Any = None) -> Edit:
    """Activation patching: the value ``other_trace`` holds at the same site."""
    return _Patch(other_trace, index=index, item=item, head=head)


def mean(source: Any, label: str | None = None,
        *, index: Any = None, item: Any = None, head: Any = None) -> Edit:
    """Mean ablation: the mean over rows of a tensor, a saved trace's batch at the same site,
    or a recording store's ``label``."""
    return _Mean(source, label, index=index, item=item, head=head)


def skip(*, index: Any = None, item: Any = None, head: Any = None) -> Edit:
    """A module's output becomes its input (refuses ``edit_shape_mismatch`` when they differ)."""
    return _Skip(index=index, item=item, head=head)


def as_edit(value: Any) -> Edit:
    """An ``Edit`` from what ``edits={site: ...}`` holds: an edit, or a callable."""
    if isinstance(value, Edit):
        return value
    if callable(value):
        return _Call(value)
    raise InputTypeError(
        f"edits= maps sites to tl.edits values or callables fn(value, op) -> value, not "
        f"{type(value).__name__}", code="edit_invalid",
        teach=["tl.trace(model, x, edits={'relu_3': tl.edits.zero()})",
               "tl.trace(model, x, edits={'layer1.0': lambda v, op: v * 0.5})"])
