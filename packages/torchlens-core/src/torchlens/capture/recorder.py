"""The hot path: a TorchFunctionMode that records every torch-level call of a forward pass.

Graph edges follow tensor identity (id plus a weak reference, so a reused id never links the wrong
tensor) and the version counter (an in-place write through a view re-routes later readers of the
base to the writing op). Only top-level calls are seen: inside the handler the mode is off.
"""

from __future__ import annotations

import weakref
from functools import partial
from math import prod
from time import perf_counter_ns
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..sites import function_of
from .cow import SET_DATA, Held, may_write, storage_key, written_by
from .flops import FORMULAS, WEIGHT_ARG, flops_of, shapes
from .naming import NAMES as _names
from .naming import func_name
from .record import OpRecord, field
from .transforms import in_front, inside, is_wrapped, unwrapped

Tensor = torch.Tensor
Parameter = torch.nn.Parameter
UninitializedTensorMixin = torch.nn.parameter.UninitializedTensorMixin
_ref = weakref.ref

# Calls that never return a tensor and never mutate: skipped before any bookkeeping.
PASSTHROUGH = {
    Tensor.size, Tensor.dim, Tensor.numel, Tensor.__len__, Tensor.stride, Tensor.__repr__,
    Tensor.__format__, Tensor.item, Tensor.tolist, Tensor.__bool__, Tensor.__int__,
    Tensor.__float__, Tensor.__index__, Tensor.is_contiguous, Tensor.data_ptr,
    Tensor.element_size, Tensor.is_floating_point, Tensor.is_complex, Tensor.__hash__,
    Tensor.get_device, Tensor.nelement, Tensor.ndimension,
    Tensor.storage_offset, Tensor.__reduce_ex__,
    Tensor.shape.__get__, Tensor.dtype.__get__, Tensor.device.__get__, Tensor.ndim.__get__,
    Tensor.is_cuda.__get__, Tensor.requires_grad.__get__, Tensor.grad_fn.__get__,
    Tensor.is_leaf.__get__, Tensor.layout.__get__,
    Tensor.is_sparse.__get__, Tensor.is_quantized.__get__, Tensor.is_meta.__get__,
    Tensor._version.__get__, Tensor.is_nested.__get__, Tensor._base.__get__,
    Tensor.output_nr.__get__,
}
# Calls that hand a tensor's memory to what TorchLens cannot follow (an array, a storage, a
# DLPack capsule): values saved by reference on that memory are copied
_ESCAPES = {Tensor.numpy, Tensor.__array__, Tensor.untyped_storage, Tensor.storage,
            Tensor.__dlpack__}
_SETITEM = Tensor.__setitem__
# True only while Dynamo traces the caller: flex attention compiles its first call even when run
# eagerly, tracing the capture's mode with it; there the op runs alone (recorded when it runs)
_traced = torch.compiler.is_dynamo_compiling
_AUTOCAST = ("cpu", "cuda")  # device types whose autocast regions validation replays
_NONE: tuple = ()
EMPTY: dict = {}  # kwargs of a call without any (never written)
# calls whose output shares its input's storage without being a view in autograd's sense
# (``view(dtype)`` is not one)
_ALIASES = frozenset({"detach", "data", "alias", "set_", "view"})
# element types of a tuple/list argument that cannot hold a tensor (strides, paddings, sizes)
_SCALARS = frozenset({int, float, bool, type(None), str, slice, type(Ellipsis), torch.Size})



class CaptureState:
    """Everything one capture accumulates; the Trace is built from it afterwards."""

    # slots: the recorder reads these between every two ops, and an instance of more than 30
    # attributes in a plain ``__dict__`` loses CPython's fast attribute reads
    __slots__ = ("advisories", "autocast", "buffer_ids", "calls", "data_aliases", "decided",
                 "failure", "frames", "grads", "guard", "held", "keep", "keep_outputs",
                 "labelled", "light", "live", "model", "name_counts", "orders", "output_objects",
                 "param_ids", "real", "records", "save_all", "save_labels", "seam", "shapes",
                 "sites", "suspended", "tensors", "transformed", "values", "versions", "writes")

    def __init__(self, param_ids: dict[int, str], buffer_ids: dict[int, str], save_all: bool,
                 save_labels: set[str]):
        self.records: list[dict[str, Any]] = []
        self.values: dict[int, Any] = {}
        self.tensors: dict[int, tuple[int, Any, int]] = {}  # id -> (record, weakref, version)
        # storage data_ptr -> in-place writes on it: (record index, offset, shape, stride)
        self.writes: dict[int, list[tuple]] = {}
        # storage data_ptr -> (id, weakref) of tensors and their ``.data`` aliases
        self.data_aliases: dict[int, list[tuple]] = {}
        self.param_ids, self.buffer_ids = param_ids, buffer_ids
        self.save_all, self.save_labels = save_all, save_labels
        self.labelled = bool(save_labels)  # labels are made during the forward, not after it
        # the seam where a value may be replaced after its op ran (an edit plan naming op
        # sites: ``edits.EditPlan.op``); None in an unedited capture
        self.seam: Any = None
        # [address, pass, per-call name counters (made on first use), first record, start ns,
        #  module, enclosing frame (None for the root)]; see boundaries.install
        self.frames: list[list] = [["", 1, None, 0, 0, None, None]]
        self.shapes: dict[torch.Size, torch.Size] = {}  # each output shape once
        self.sites: dict[tuple, str] = {}
        self.name_counts: dict[str, int] = {}
        self.failure: dict[str, Any] | None = None
        self.model: Any = None
        self.suspended = 0  # > 0 while a lazy module initializes its parameters
        self.light: dict[str, Any] | None = None  # selected values of a light capture
        self.keep = _keep_copy  # what a light capture keeps of a selected value
        self.output_objects: list[Any] = []  # non-JSON output values, kept in memory
        self.calls: dict[int, tuple] | None = None  # replay templates, when asked for
        self.live: dict[int, Any] | None = None  # the real output tensors, when asked for
        self.decided: set[int] = set()  # ops whose values a Python decision read (templates)
        self.grads: dict[tuple[int, int], Any] = {}  # output gradients seen by tensor hooks
        self.versions: dict[tuple[int, int], int] = {}  # output versions right after each op
        self.orders: dict[int, list] = {}  # a transformed op's outputs' dimension orders
        self.autocast: dict[int, tuple] = {}  # the autocast regions an op ran in
        self.advisories: list[dict[str, Any]] = []
        self.held: Held | None = None  # saved values kept by reference (copy-on-write)
        self.guard: Any = None  # a pinned block's: called with what a call is about to write
        # a functorch transform (``torch.vmap``) has been entered and not yet seen left; the real
        # tensors under its ops' outputs, by id, held until the end so that what the transform
        # returns (one of them or a view of one) keeps its identity
        self.transformed = False
        self.real: dict[int, tuple[Tensor, tuple[int, ...]]] = {}  # id -> (tensor, its order)

    # -- identity ------------------------------------------------------------------------------
    def register(self, t: Tensor, index: int, position: int = 0) -> None:
        self.tensors[id(t)] = (index, _ref(t), t._version, position)

    def template(self, value: Any, depth: int = 0) -> Any:
        """``value`` with every tensor replaced by a reference (op output, param, buffer) or a
        copied constant, so the call can be replayed from saved values."""
        if isinstance(value, Tensor):
            if is_wrapped(value):  # replayed under vmap, from the real tensor under it
                real, order, levels = unwrapped(value)
                made = self.real.get(id(real))  # an op's output: saved in the order it had then
                if made is not None:
                    order = tuple(made[1].index(d) for d in order)
                if order == tuple(range(len(order))):
                    order = None
                return ("batched", self.template(real, depth), order, levels)
            key = id(value)
            entry = self.tensors.get(key)
            index = self.producer(value) if entry is not None and entry[1]() is value else None
            if index is None and self.real and value._base is not None:
                made = self.real.get(id(value._base))
                if made is not None and made[0].is_contiguous():
                    # what torch.vmap returned: a view of a real tensor saved in its own order
                    real, order = made
                    return ("view", self.template(real, depth), tuple(map(order.index, range(
                        len(order)))), tuple(value.shape), value.stride(),
                        value.storage_offset() - real.storage_offset())
            if index is None and key in self.param_ids:
                return ("param", self.param_ids[key])
            if index is None and key in self.buffer_ids:
                return ("buffer", self.buffer_ids[key])
            if index is not None:
                if entry[0] == index:
                    return ("op", index, entry[3])
                # written in place through another view: replay reads the writer's value when
                # it holds exactly these elements, else the value as it is now
                written = field.shape(self.records[index]) if index < len(self.records) else None
                if written is not None and prod(written) == value.numel():
                    return ("op", index, 0, tuple(value.shape))
            return ("const", value.detach().clone())
        if isinstance(value, (tuple, list)) and depth < 3:
            return type(value)(self.template(v, depth + 1) for v in value) if not hasattr(
                value, "_fields") else value
        if isinstance(value, dict) and depth < 3:
            return {k: self.template(v, depth + 1) for k, v in value.items()}
        return value

    def edges(self, args: tuple, kwargs: dict, tensors: dict) -> tuple | None:
        """(parents, parameters, buffers) a call read: the producers of its tensor arguments
        (their indices, through ``tensors``; one producer as the index itself), and the names
        of the parameters and buffers among them. None: a lazy module materializing itself,
        which is no op of the model."""
        param_ids, buffer_ids = self.param_ids, self.buffer_ids
        inputs = _inputs(args, kwargs) if kwargs else args
        while True:  # runs once, twice when a positional argument is a sequence holding tensors
            parents: list[int] = []
            params = buffers = _NONE
            for t in inputs:
                if type(t) is not Tensor and not isinstance(t, Tensor):
                    if inputs is args and isinstance(t, (tuple, list)) and \
                            not _SCALARS.issuperset(map(type, t)):
                        inputs = _inputs(args, kwargs)
                        break
                    continue
                key = id(t)
                p = param_ids.get(key)
                if p is not None:
                    params = params + (p,)
                    if not self.writes and key not in tensors:
                        continue  # no op returned it (``w.float()`` can) nor wrote it in place
                elif buffer_ids:
                    b = buffer_ids.get(key)
                    if b is not None:
                        buffers = buffers + (b,)
                if p is None and type(t) is not Tensor and isinstance(t, Parameter) and \
                        self.model is not None and key not in buffer_ids:
                    if isinstance(t, UninitializedTensorMixin):
                        return None
                    adopted = self.adopt_parameter(t)
                    if adopted is not None:
                        params = params + (adopted,)
                entry = tensors.get(key)
                if entry is not None and entry[1]() is t:
                    # a parameter or buffer written in place in the forward reads from its writer
                    index = entry[0] if not self.writes or t._version == entry[2] else \
                        self.producer(t)
                    if index not in parents:
                        parents.append(index)
                elif p is None and key not in buffer_ids:  # no op made it, or a transform's
                    # wrapper of one that an op made
                    index = self.unseen(t)
                    if index is not None and index not in parents:
                        parents.append(index)
            else:
                break
        return (parents[0] if len(parents) == 1 else parents), params, buffers

    def made_by(self, t: Tensor) -> tuple[int, int] | None:
        """(record index, output position) of the op that returned ``t`` as it is, or None."""
        entry = self.tensors.get(id(t)) if self.tensors else None
        if entry is None or entry[1]() is not t:
            return None
        return entry[0], entry[3]

    def producer(self, t: Tensor) -> int | None:
        entry = self.tensors.get(id(t))
        if entry is None or entry[1]() is not t:
            return self.unseen(t)
        index = entry[0]
        if t._version != entry[2] and self.writes:
            if is_wrapped(t):
                t = unwrapped(t)[0]
            # written in place since (through itself or a view): the latest write that touches
            # this tensor's elements is what a read sees
            geometry = (t.storage_offset(), tuple(t.shape), t.stride())
            for write in reversed(self.writes.get(storage_key(t), ())):
                if write[0] <= index:
                    break
                if _overlap(geometry, write[1:]):
                    return write[0]
        return index

    def unseen(self, t: Tensor) -> int | None:
        """The op behind a tensor no op returned as it is: a transform's wrapper of one (what
        ``vmap`` passes its function), or a view of the real tensor under a transformed op's
        output (what ``vmap`` returns with the vmapped dimension elsewhere); else None."""
        if is_wrapped(t):
            self.transformed = True
            t = unwrapped(t)[0]
        elif not self.real or t._base is None or id(t._base) not in self.real:
            return None
        else:
            t = t._base
        entry = self.tensors.get(id(t))
        if entry is None or entry[1]() is not t:
            return None
        return entry[0] if t._version == entry[2] or not self.writes else self.producer(t)

    def substitute(self, index: int, position: int, t: Tensor) -> None:
        """``t`` (an edited value) stands for op ``index``'s output from now on: readers link to
        the op, and a saved value is the edited one."""
        self.tensors[id(t)] = (index, _ref(t), t._version, position)
        if index not in self.values:
            return
        if self.held is not None:
            self.held.forget(index)
        saved = self.values[index]
        if isinstance(saved, tuple):
            saved = list(saved)
            saved[position] = snapshot(t)
            self.values[index] = tuple(saved)
        else:
            self.values[index] = snapshot(t)

    def adopt_parameter(self, p: Tensor) -> str | None:
        """Register a parameter the forward created (e.g. a lazy module built inside forward)."""
        for name, candidate in self.model.named_parameters():
            if candidate is p:
                self.param_ids[id(p)] = name
                self.advisories.append({
                    "code": "parameter_created_in_forward", "parameter": name,
                    "module": name.rpartition(".")[0], "shape": list(p.shape),
                    "in_module_call": self.frames[-1][0],
                })
                return name
        return None

    # -- labels --------------------------------------------------------------------------------
    def label_for(self, name: str, frame: list | None = None) -> tuple[str, str, int]:
        """(label, base label, pass) of the next ``name`` call in ``frame`` (default: the
        innermost open module call). Called once per op, in op order (``LightRecorder`` has it
        inline)."""
        if frame is None:
            frame = self.frames[-1]
        counters = frame[2]
        if counters is None:
            counters = frame[2] = {}
        ordinal = counters.get(name, 0) + 1
        counters[name] = ordinal
        site = (frame[0], name, ordinal)
        base = self.sites.get(site)
        if base is None:
            n = self.name_counts.get(name, 0) + 1
            self.name_counts[name] = n
            base = f"{name}_{n}"
            self.sites[site] = base
        pass_num = frame[1]
        return (base if pass_num == 1 else f"{base}:{pass_num}"), base, pass_num


def _span(offset: int, shape: tuple, stride: tuple) -> tuple[int, int]:
    if not all(shape):
        return offset, offset
    return offset, offset + sum((n - 1) * abs(s) for n, s in zip(shape, stride)) + 1


def _overlap(a: tuple, b: tuple) -> bool:
    """Whether two views (offset, shape, stride) of one storage share an element: exact for
    small views, by span beyond that (never misses an overlap)."""
    if a == b:
        return True
    (lo_a, hi_a), (lo_b, hi_b) = _span(*a), _span(*b)
    if hi_a <= lo_b or hi_b <= lo_a:
        return False
    if max(hi_a, hi_b) > 1 << 20 or any(s < 0 for s in a[2] + b[2]):
        return True
    with torch._C.DisableTorchFunction():  # module frames call this while the recorder is on
        base = torch.arange(max(hi_a, hi_b))
        elements_a = base.as_strided(a[1], a[2], a[0]).reshape(-1)
        elements_b = base.as_strided(b[1], b[2], b[0]).reshape(-1)
        return bool(torch.isin(elements_a, elements_b).any())


def _keep_grad(store: dict, key: tuple[int, int], grad: Tensor) -> None:
    store[key] = grad


def snapshot(value: Any) -> Any:
    """A detached copy that later in-place ops cannot change."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return tuple(snapshot(v) for v in value)
    return value


def _keep_copy(key: str, value: Any) -> Any:
    return snapshot(value)


def _collect(value: Any, found: list, depth: int = 0) -> None:
    if isinstance(value, Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)) and depth < 3:
        for item in value:
            _collect(item, found, depth + 1)
    elif isinstance(value, dict) and depth < 3:
        for item in value.values():
            _collect(item, found, depth + 1)


def _inputs(args: tuple, kwargs: dict) -> list:
    """Every tensor a call reads: its arguments, keyword arguments and their sequences."""
    found: list = []
    for group in (args, kwargs.values()) if kwargs else (args,):
        for a in group:
            if isinstance(a, Tensor):
                found.append(a)
            elif isinstance(a, (tuple, list)) and not _SCALARS.issuperset(map(type, a)):
                _collect(a, found)
    return found


def ragged(t: Tensor) -> tuple[tuple, int]:
    """(shape, bytes) of a strided nested tensor: None for a dimension its parts differ in."""
    sizes = t._nested_tensor_size().tolist()
    dims = tuple(d[0] if len(set(d)) == 1 else None for d in zip(*sizes)) if sizes else ()
    return (len(sizes), *dims), t.numel() * t.element_size()


def tensor_outputs(func, first: Any, out: Any) -> list[Tensor] | None:
    """The tensors a call produced (``__setitem__``, ``t.data = v``: the tensor it wrote), or
    None: not an op."""
    if func is _SETITEM or func == SET_DATA:
        return [first]
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [o for o in out if isinstance(o, Tensor)] or None
    return None


class Recorder(TorchFunctionMode):
    """Records each top-level torch call made while it is active."""

    def __init__(self, state: CaptureState):
        super().__init__()
        self.state = state

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Everything here runs between two ops of the user's forward, where the CPU caches are
        # cold: it keeps only what cannot be derived after the forward (edges, facts of tensors
        # that may die, the module frame, the time), inline: a call to ``CaptureState.edges``
        # here cost 1.5 us an op (bench:ab). ``edges`` and ``costs`` are the same rules as
        # functions, for a step follower's check (``record_ran``): a step is followed only
        # while the two agree, which the step tests see.
        s = self.state
        if func in PASSTHROUGH or s.suspended or _traced():
            return func(*args, **kwargs) if kwargs else func(*args)
        if kwargs is None:
            kwargs = EMPTY
        if (s.guard is not None or s.held is not None and s.held.entries) and \
                may_write(func, kwargs):
            targets = written_by(func, args, kwargs)
            if targets:
                if s.guard is not None:
                    s.guard(targets)
                if s.held is not None and s.held.entries:
                    s.held.before_write(targets)
        first = args[0] if args else None
        version_before = first._version if type(first) is Tensor or isinstance(
            first, Tensor) else None
        t0 = perf_counter_ns()
        try:
            out = func(*args, **kwargs) if kwargs else func(*args)
        except BaseException as exc:
            self.note_failure(func, args, kwargs, exc)
            raise
        elapsed = perf_counter_ns() - t0
        if type(out) is Tensor:
            main, out_tensors = out, None
        else:
            out_tensors = tensor_outputs(func, first, out)
            if out_tensors is None:
                if func in _ESCAPES and s.held is not None and isinstance(first, Tensor):
                    s.held.escape(first)
                return out
            main = out_tensors[0]
            if len(out_tensors) == 1 and not main.is_nested:  # (a ragged one: bytes counted now)
                out_tensors = None
        name = _names.get(func) or func_name(func)
        tensors = s.tensors
        param_ids, buffer_ids = s.param_ids, s.buffer_ids
        inputs = _inputs(args, kwargs) if kwargs else args
        while True:  # runs once, twice when a positional argument is a sequence holding tensors
            parents: list[int] = []
            params = buffers = _NONE
            for t in inputs:
                if type(t) is not Tensor and not isinstance(t, Tensor):
                    if inputs is args and isinstance(t, (tuple, list)) and \
                            not _SCALARS.issuperset(map(type, t)):
                        inputs = _inputs(args, kwargs)
                        break
                    continue
                key = id(t)
                p = param_ids.get(key)
                if p is not None:
                    params = params + (p,)
                    if not s.writes and key not in tensors:
                        continue  # no op returned it (``w.float()`` can) nor wrote it in place
                elif buffer_ids:
                    b = buffer_ids.get(key)
                    if b is not None:
                        buffers = buffers + (b,)
                if p is None and type(t) is not Tensor and isinstance(t, Parameter) and \
                        s.model is not None and key not in buffer_ids:
                    if isinstance(t, UninitializedTensorMixin):
                        return out
                    adopted = s.adopt_parameter(t)
                    if adopted is not None:
                        params = params + (adopted,)
                entry = tensors.get(key)
                if entry is not None and entry[1]() is t:
                    # a parameter or buffer written in place in the forward reads from its writer
                    index = entry[0] if not s.writes or t._version == entry[2] else \
                        s.producer(t)
                    if index not in parents:
                        parents.append(index)
                elif p is None and key not in buffer_ids:  # no op made it, or a transform's
                    # wrapper of one that an op made
                    index = s.unseen(t)
                    if index is not None and index not in parents:
                        parents.append(index)
            else:
                break

        if len(parents) == 1:
            parents = parents[0]
        elif not parents and not s.transformed and is_wrapped(main):
            s.transformed = True  # an op without inputs can be the first inside a transform
        inplace = main is first and first._version != version_before
        if s.transformed:  # inside a functorch transform (``torch.vmap``), or just out of one
            if inside() is None:
                s.transformed = False
            elif is_wrapped(main):  # record the real tensors, vmapped dimensions first
                return self._record_real(func, name, args, kwargs, out, out_tensors or [main],
                                         parents, params, buffers, inplace, elapsed)
        index = len(s.records)
        frame = s.frames[-1]
        label = None
        if s.labelled:  # labels are needed now, to decide what to keep or to edit
            label, base, _ = s.label_for(name, frame)
            if s.seam is not None and base in s.seam.ops:
                edited = s.seam.op(out, label, base, frame[1], frame, name, args, kwargs, index,
                                   inplace)
                if edited is not out:
                    out = edited
                    if type(out) is Tensor or isinstance(out, Tensor):
                        main = out
                    else:
                        out_tensors = tensor_outputs(func, first, out)
                        main = out_tensors[0]
                        if len(out_tensors) == 1:
                            out_tensors = None
        shape = None
        if out_tensors is None:
            try:
                shape = main.shape
            except RuntimeError:  # a strided nested tensor has no sizes: ``costs`` counts it
                pass
        if shape is not None:  # ``costs``, inline for one output
            out_shapes = nbytes = flops = None
            if name in FORMULAS:
                weight = WEIGHT_ARG.get(name)
                if weight is not None and len(args) > weight[0]:
                    flops = s.param_ids.get(id(args[weight[0]]))
                if flops is None:
                    flops = ([a.shape if isinstance(a, Tensor) else a for a in args],
                             shapes(kwargs) if kwargs else kwargs)
            shape = s.shapes.setdefault(shape, shape)
        else:
            shape, out_shapes, nbytes, flops = self.costs(name, args, kwargs, main, out_tensors)
        is_view = not inplace and main._is_view()
        s.records.append((  # an OpRecord, as a plain tuple (``record.field``)
            name, frame, parents, params, buffers, shape, main.dtype, main.device, out_shapes,
            nbytes, inplace, is_view, flops, elapsed, label, "op", None))
        if s.calls is not None:
            self._keep_for_replay(index, func, args, kwargs, out, out_tensors or [main])
        ref = _ref(main)
        if s.save_all or (label is not None and (label in s.save_labels or base in s.save_labels)):
            if out_shapes is None and s.held is not None:
                s.held.keep(index, main, ref, is_view or inplace or name in _ALIASES)
            else:
                s.values[index] = snapshot(out if out_shapes else main)
        if out_tensors is None:
            tensors[id(main)] = (index, ref, main._version, 0)
        else:
            for position, t in enumerate(out_tensors):
                tensors[id(t)] = (index, _ref(t), t._version, position)
        if inplace:
            key = storage_key(first)
            s.writes.setdefault(key, []).append(
                (index, first.storage_offset(), tuple(first.shape), first.stride()))
            for other, other_ref in s.data_aliases.get(key, ()) if s.data_aliases else ():
                # ``t.data`` has a version counter of its own: a write through it (or into
                # ``t`` under it) leaves the other's counter as it was, so re-route it here
                t = other_ref()
                if t is not None and t is not first:
                    tensors[other] = (index, other_ref, t._version, 0)
        if name == "data" and first is not None:  # ``t.data``: ``t`` and it share memory
            s.data_aliases.setdefault(storage_key(main), []).extend(
                ((id(first), _ref(first)), (id(main), ref)))
        if kwargs and kwargs.get("out") is not None:  # written through out=: a write too
            for t in out_tensors or [main]:
                s.writes.setdefault(storage_key(t), []).append(
                    (index, t.storage_offset(), tuple(t.shape), t.stride()))
        return out

    def costs(self, name: str, args: tuple, kwargs: dict, main: Tensor,
              outs: list | None) -> tuple:
        """(shape, out_shapes, nbytes, FLOPs) of a call that ran: its output's shape (each
        shape once), every output's shape and their bytes when it made several (or a ragged
        one), and what its FLOPs are counted from (``record.OpRecord``)."""
        if outs is None:
            out_shapes = nbytes = None
        else:
            out_shapes = [t.shape for t in outs]
            nbytes = sum(t.element_size() * t.numel() for t in outs)
        flops = None
        if name in FORMULAS:
            weight = WEIGHT_ARG.get(name)
            if weight is not None and len(args) > weight[0]:
                flops = self.state.param_ids.get(id(args[weight[0]]))
            if flops is None:
                flops = ([a.shape if isinstance(a, Tensor) else a for a in args],
                         shapes(kwargs) if kwargs else kwargs)
        try:
            shape = main.shape
        except RuntimeError:  # a strided nested tensor has no sizes
            shape, nbytes = ragged(main)
            out_shapes = [shape]
        return self.state.shapes.setdefault(shape, shape), out_shapes, nbytes, flops

    def record_ran(self, tensors: dict, name: str, frame: list, args: tuple, kwargs: dict,
                   main: Tensor, outs: list | None, elapsed: int) -> tuple:
        """The record of a call that already ran, wrote nothing in place and is no transform's,
        built as the recorder builds every record (its edges through ``tensors``: the ids of
        the tensors made so far), without registering it: a step follower's check."""
        parents, params, buffers = self.state.edges(args, kwargs, tensors)
        shape, out_shapes, nbytes, flops = self.costs(name, args, kwargs, main, outs)
        return (name, frame, parents, params, buffers, shape, main.dtype, main.device,
                out_shapes, nbytes, False, main._is_view(), flops, elapsed, None, "op", None)

    def _record_real(self, func, name, args, kwargs, out, outs, parents, params, buffers,
                     inplace, elapsed):
        """An op inside a functorch transform: its record holds the real tensors' facts (shape,
        size, FLOPs), its value is copied (the wrappers die with the transform), and the real
        tensors are held, so what the transform returns is found again."""
        s = self.state
        real = [unwrapped(t) for t in outs]
        views = [in_front(r, order) for r, order, _ in real]
        main = outs[0]
        if not inplace and args and main is args[0]:  # a wrapper's own version never moves
            entry = s.tensors.get(id(real[0][0]))
            inplace = entry is not None and entry[2] != real[0][0]._version
        index = len(s.records)
        label = base = None
        if s.labelled:
            label, base, _ = s.label_for(name, s.frames[-1])
        flops = None
        if name in FORMULAS:  # counted now: one example's (the wrappers' shapes) times the batch
            flops = flops_of(name, [a.shape if isinstance(a, Tensor) else a for a in args],
                             shapes(kwargs) if kwargs else {}, main.shape)
            if flops is not None:
                flops *= prod(views[0].shape[:len(real[0][2])])
        several = len(views) > 1
        shape = views[0].shape
        s.records.append(OpRecord(
            name, s.frames[-1], parents, params, buffers,
            s.shapes.setdefault(shape, shape), main.dtype, main.device,
            [v.shape for v in views] if several else None,
            sum(v.element_size() * v.numel() for v in views) if several else None,
            inplace, not inplace and main._is_view(), flops, elapsed, label, "op", None))
        if s.save_all or (label is not None and (label in s.save_labels or base in s.save_labels)):
            s.values[index] = tuple(map(snapshot, views)) if several else snapshot(views[0])
        if s.calls is not None:  # validation replays it under vmap, on the real tensors
            reals = [r for r, _, _ in real]
            self._keep_for_replay(index, func, args, kwargs, tuple(reals), reals)
            s.orders[index] = [order for _, order, _ in real]
        for position, (t, (r, order, _)) in enumerate(zip(outs, real)):
            s.tensors[id(t)] = (index, _ref(t), t._version, position)
            s.tensors[id(r)] = (index, _ref(r), r._version, position)
            s.real[id(r)] = (r, order)
        if inplace:
            r = real[0][0]
            s.writes.setdefault(storage_key(r), []).append(
                (index, r.storage_offset(), tuple(r.shape), r.stride()))
        return out

    def _keep_for_replay(self, index, func, args, kwargs, out, out_tensors) -> None:
        """Validation: the call's template, its live output, versions and output gradients
        (``trace.push``: the template alone)."""
        s = self.state
        s.calls[index] = (func, s.template(args), s.template(kwargs))
        casts = tuple((device, torch.get_autocast_dtype(device)) for device in _AUTOCAST
                      if torch.is_autocast_enabled(device))
        if casts:  # replayed in the same autocast regions
            s.autocast[index] = casts
        if s.live is None:  # templates alone (``trace.push``): no live outputs, no hooks
            return
        s.live[index] = out if len(out_tensors) > 1 else out_tensors[0]
        for position, t in enumerate(out_tensors):
            s.versions[(index, position)] = t._version
            if t.requires_grad:
                # a view whose elements were written through another view has a stale grad_fn
                # until it is read, and torch crashes (SIGSEGV) registering a hook before that
                t.grad_fn  # noqa: B018
                t.register_hook(partial(_keep_grad, s.grads, (index, position)))

    def note_failure(self, func: Any, args: tuple, kwargs: dict | None, exc: BaseException
                     ) -> None:
        """Where the forward raised: the first call that raised, its inputs and module call."""
        s = self.state
        if s.failure is not None:
            return
        shapes = []
        found: list = []
        _collect(list(args) + list((kwargs or {}).values()), found)
        shapes = [tuple(t.shape) for t in found]
        frame = s.frames[-1]
        s.failure = {
            "func": func_name(func), "module": frame[0], "module_pass": frame[1],
            "input_shapes": shapes, "after_op": len(s.records),
        }


# calls whose answer is a Python value read from a tensor's values: what the forward did next
# may depend on it (an ``if``, a loop count, a shape)
_DECIDES = {Tensor.item, Tensor.tolist, Tensor.__bool__, Tensor.__int__, Tensor.__float__,
            Tensor.__index__, Tensor.__complex__, Tensor.numpy, Tensor.__array__, torch.equal,
            Tensor.equal, torch.allclose, Tensor.allclose, torch.is_nonzero, Tensor.is_nonzero}


class TemplateRecorder(Recorder):
    """Records as Recorder does and keeps each call's template; notes the ops whose values a
    Python decision read (``state.decided``), so a recomputation knows where the graph itself
    could change."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _DECIDES and args:
            s = self.state
            for t in _inputs(args, kwargs or EMPTY):
                if isinstance(t, Tensor):
                    index = s.producer(t)
                    if index is not None:
                        s.decided.add(index)
        return super().__torch_function__(func, types, args, kwargs)


def label_names(labels: set[str]) -> set[str]:
    """The function names the op labels are made of (``linear_3:2`` -> ``linear``)."""
    return {function_of(label) for label in labels}


class LightRecorder(Recorder):
    """Labels calls exactly like Recorder but keeps only the selected activations. A label
    counts only calls of its own function name, so calls of other names are not counted."""

    def __init__(self, state: CaptureState):
        super().__init__(state)
        self.names = label_names(state.save_labels | set(state.seam.ops if state.seam else ()))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        s = self.state
        if func in PASSTHROUGH or s.suspended or _traced():
            return func(*args, **kwargs) if kwargs else func(*args)
        out = func(*args, **kwargs) if kwargs else func(*args)
        name = _names.get(func) or func_name(func)
        if name not in self.names:
            return out
        tensors = [out] if type(out) is Tensor else tensor_outputs(func, args[0] if args else None,
                                                                   out)
        if tensors is None:
            return out
        for a in args:
            if type(a) is not Tensor and isinstance(a, UninitializedTensorMixin):
                return out
        # label_for(name), inline: it runs for every op of a selected label's function
        frame = s.frames[-1]
        counters = frame[2]
        if counters is None:
            counters = frame[2] = {}
        ordinal = counters[name] = counters.get(name, 0) + 1
        base = s.sites.get(site := (frame[0], name, ordinal))
        if base is None:
            n = s.name_counts[name] = s.name_counts.get(name, 0) + 1
            base = s.sites[site] = f"{name}_{n}"
        label = base if frame[1] == 1 else f"{base}:{frame[1]}"
        if s.seam is not None and base in s.seam.ops:
            first = args[0] if args else None
            out = s.seam.op(out, label, base, frame[1], frame, name, args, kwargs or EMPTY, None,
                            out is first and name.endswith("_"))
            tensors = [out] if type(out) is Tensor else tensor_outputs(func, first, out)
        if label in s.save_labels or base in s.save_labels:
            value = out if len(tensors) > 1 else tensors[0]
            if is_wrapped(tensors[0]):  # inside torch.vmap: the real tensors, vmapped dims first
                value = tuple(in_front(*unwrapped(t)[:2]) for t in tensors)
                value = value if len(value) > 1 else value[0]
            s.light[label] = s.keep(label, value)
        return out
