"""Run one captured forward: module-call frames plus the recorder, then build the Trace.

The frames' wrappers and hooks (``boundaries``) live on the model's own submodules only for the
capture and are removed in ``finally``; whatever the forward raises, the error carries the op
where it happened and the partial trace.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from math import prod
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import Parameter, is_lazy

from ..collector import paused
from ..compiled import eager
from ..errors import InputError, InputTypeError, TorchLensError, add_note, surface_call, warn
from ..sites import name_of, split_pass
from ..sites import resolve as resolve_site
from ..trace import SCHEMA_VERSION, Module, ModuleCall, Op, Trace
from ..units import format_shapes
from ..version import __version__ as _tl_version
from .boundaries import fields_of, leaves
from .boundaries import install as install_boundaries
from .cow import Held, storage_key
from .flops import flops_of, flops_of_weight
from .inventory import Inventory, inventory
from .meta import is_meta, is_value_error, op_unsupported
from .offload import homes, quiet_hooks
from .record import OpRecord, field, fields
from .recorder import (
    CaptureState,
    LightRecorder,
    Recorder,
    TemplateRecorder,
    snapshot,
)
from .seam import CaptureRequest, Part, Session, combine
from .watch import note_writes, write_guard

_active = threading.local()
_DEVICE = fields("device")
_COSTED = fields("func", "shape", "dtype", "out_shapes", "nbytes", "flops")
_NORM = nn.modules.batchnorm._NormBase


def capturing() -> bool:
    """True while this thread is inside a captured forward."""
    return getattr(_active, "depth", 0) > 0


def saves_nothing(save: Any) -> bool:
    """``save=None`` (also ``False`` or the text ``"none"``): metadata only."""
    return save is None or save is False or save == "none"


def parse_save(save: Any, model: nn.Module, inv: Inventory | None = None,
               surface: str = "trace") -> tuple[bool, set[str], set[str]]:
    """Split ``save=`` into (all, labels, module addresses); module addresses are checked now
    (a refusal teaches the call of ``surface``)."""
    if save == "all":
        return True, set(), set()
    if saves_nothing(save):
        return False, set(), set()
    if isinstance(save, str):
        save = [save]
    if not isinstance(save, (list, tuple, set, frozenset)) or not all(
        isinstance(s, str) for s in save
    ):
        raise InputTypeError(
            f"save= takes 'all', None, or a list of op labels / module addresses, not {save!r}",
            code="save_selection_invalid",
            teach=[surface_call(surface, "save='all'"),
                   surface_call(surface, "save=['conv2d_1', 'fc']")],
        )
    addresses = (inv or inventory(model)).addresses
    labels, modules = set(), set()
    for text in save:
        sites = resolve_site(text, addresses, option="save=", model_class=type(model).__name__,
                             code="save_selection_invalid",
                             example=lambda c: surface_call(surface, f"save={[c]!r}"))
        for site in sites:
            if site.kind == "name":
                raise InputError(
                    f"save= names {text!r}, a transformer name, on a surface that does not "
                    "bind transformer names", code="save_selection_invalid",
                    teach=[f"tl.trace(model, x, save=[{text!r}])"])
            (labels.add(text) if site.kind == "op" else modules.add(site.name))
    return False, labels, modules


def capture(request: CaptureRequest, parts: Sequence[Part] = ()) -> Trace:
    """Run ``request.model(*request.args, **request.kwargs)`` once under the recorder, with
    ``parts`` taking part (``seam``: the protocol and its call order), and return its Trace."""
    with paused():
        return _capture(request, list(parts))


def _capture(request: CaptureRequest, parts: list) -> Trace:
    if any(p.light for p in parts):
        return _capture_light(request, parts)
    model, args, kwargs, save = request.model, request.args, request.kwargs, request.save
    inv = request.inventory or inventory(model)
    save_all, save_labels, save_modules = parse_save(save, model, inv)
    # the inventory's id tables (each capture takes its own inventory, so they are its to grow)
    state = CaptureState(inv.param_ids, inv.buffer_ids, save_all, save_labels)
    state.keep_outputs = not saves_nothing(save)
    state.model = model
    state.guard = write_guard()  # inside a pinned block: parameters copied before a write
    needs = frozenset().union(*(p.needs for p in parts))
    seam = combine(parts)
    if seam is not None:
        _plug(state, seam)
    if "live" in needs:
        state.calls, state.live = {}, {}
    else:
        if "templates" in needs:
            state.calls = {}
        if save_all or save_labels:
            state.held = Held(state.values)
    _add_inputs(state, args, kwargs)
    session = Session(request, state, [t for _, t in _input_leaves(args, kwargs)])
    calls = session.calls
    for part in parts:
        part.start(session)
    offloaded = inv.hooked
    no_values = inv.has_meta and is_meta(model)
    recorder = (TemplateRecorder if "decisions" in needs else Recorder)(state)
    leader = None
    mode = recorder
    for part in parts:
        led = part.lead(recorder, session)
        if led is not None:
            leader, mode = part, led
    kept = request.frames
    handles = install_boundaries(inv.modules, state, calls, save_modules, seam) if kept is None \
        else kept.open(inv.modules, state, calls, save_modules, seam)  # removed below
    _active.depth = getattr(_active, "depth", 0) + 1
    t0 = time.perf_counter_ns()
    keep_out = request.keep_output or not needs.isdisjoint({"output", "live"})
    aliases: list = []  # (output record, its op's record): one saved tensor, kept once
    try:
        with quiet_hooks(model, offloaded, state), eager(), mode:
            out = model(*args, **kwargs)
        session.structure = _output_node(state, out, "", 0,
                                         [0, aliases if leader is None else None])
        if keep_out:
            session.output = out
        del out  # its tensors are kept (copied if others still reach them): let its graph go
    except BaseException as exc:
        _active.depth -= 1
        _close(handles, kept)
        session.failed = True
        session.capture_ns = time.perf_counter_ns() - t0
        for part in parts:
            part.end(session)
        note_writes(state.writes)
        lost = _settle(state, inv, args, kwargs)
        state.real.clear()  # what torch.vmap's ops made, held until now
        partial = _build(model, inv, state, calls, None, time.perf_counter_ns() - t0, save,
                         request.provenance, is_partial=True)
        _report_lost(partial, lost)
        for part in parts:
            part.finish(partial, session)
        _attach_failure(exc, state, partial)
        if no_values and (state.failure is not None or is_value_error(exc)):
            raise op_unsupported(exc, state.failure, partial) from exc
        raise
    _active.depth -= 1
    _close(handles, kept)
    session.capture_ns = time.perf_counter_ns() - t0
    for part in parts:
        part.end(session)
    result = leader.trace(session) if leader is not None else None
    if result is None:
        note_writes(state.writes)
        lost = _settle(state, inv, args, kwargs)
        for index, producer in aliases:
            if producer in state.values:
                state.values[index] = state.values[producer]
        state.real.clear()  # what torch.vmap's ops made, held until now
        _check_selection(state.records, save_labels)
        result = _build(model, inv, state, calls, session.structure, session.capture_ns, save,
                        request.provenance,
                        homes=homes(model, offloaded) if offloaded else None)
        _report_lost(result, lost)
        if no_values:
            result.meta["values"] = "meta"  # shapes and costs only: no tensor holds values
        result._objects["output_values"] = state.output_objects
    if request.keep_output:
        result._objects["forward_output"] = session.output
    for part in parts:
        part.finish(result, session)
    return result


def _close(handles: list, kept: Any) -> None:
    """Take a capture's module frames off (kept ones only stop capturing)."""
    if kept is None:
        for h in handles:
            h.remove()
    else:
        kept.close(handles)


def record_costs(record: tuple, weight_shape: Callable[[str], Any]) -> tuple:
    """(shape, out_shapes, nbytes, flops) of one raw record, as ``_objects`` makes them for
    its Op (which does it inline: it is the loop over every op of a capture)."""
    func, shape, dtype, out_shapes, nbytes, flops = _COSTED(record)
    if nbytes is None:
        nbytes = prod(shape) * dtype.itemsize
    if type(flops) is str:
        flops = flops_of_weight(func, weight_shape(flops), shape)
    elif flops is not None and type(flops) is not int:
        flops = flops_of(func, *flops, shape)
    shape = list(shape)
    if out_shapes is not None:
        shape, out_shapes = _dims(shape), [_dims(s) for s in out_shapes]
    return shape, out_shapes if out_shapes is not None else [shape], nbytes, flops


def _plug(state: CaptureState, plan: Any) -> None:
    """Plug a seam (an edit plan, a gradient observer, or both) in: op sites need labels
    during the forward."""
    if plan.ops:
        state.seam = plan
        state.labelled = True


def _settle(state: CaptureState, inv: Inventory, args: tuple, kwargs: dict) -> list[int]:
    """End copy-on-write: copy each saved value others can still reach; return the lost ones."""
    if not state.held:
        return []
    found: list = []
    leaves((args, kwargs), found)
    protected = {storage_key(t) for t in found}
    lazy = inv.lazy
    protected.update(storage_key(t) for name, t in inv.params + inv.buffers if name not in lazy)
    return state.held.settle(protected)


def _report_lost(trace: Trace, lost: list[int]) -> None:
    """Saved values that a call TorchLens cannot see wrote in place: not kept, and said so."""
    if not lost:
        return
    labels = [trace.ops[i].label for i in lost]
    trace.annotations["capture_advisories"].append(
        {"code": "activation_overwritten", "ops": labels})
    warn("activation_overwritten",
         f"the saved activations of {labels[:5]} were written in place by a call TorchLens "
         "cannot see (e.g. inside a C++ extension), so they are not kept; their metadata is",
         stacklevel=4)


def _check_selection(records: list, labels: set[str]) -> None:
    """``save=`` labels that matched no op refuse (a typo would silently save nothing). Labels
    were made during the forward whenever ``save=`` names any."""
    if not labels:
        return
    known = set(map(field.label, records))
    known |= {name_of(label) for label in known}
    unknown = sorted(labels - known)
    if unknown:
        import difflib

        close = [m for u in unknown for m in difflib.get_close_matches(u, known, n=2)]
        raise InputError(
            f"save= names {unknown}, which match no op label or module address of this forward",
            code="save_selection_invalid",
            teach=([f"tl.trace(model, x, save={close!r})"] if close else [])
            + ["tl.trace(model, x, save=None)  # then list the labels: [op.label for op in t]"])


def _capture_light(request: CaptureRequest, parts: list) -> Trace:
    """A light capture (a part is ``light``, as ``taps.Taps`` is): only labels are computed
    and only the selected values kept, as the taps' ``keep`` makes them; the Trace holds no
    ops. Module addresses alone need no per-op mode at all: their frames see the outputs."""
    model, args, kwargs = request.model, request.args, request.kwargs
    inv = request.inventory or inventory(model)
    _, save_labels, save_modules = parse_save(list(request.save or ()), model, inv)
    ends = {label for label in save_labels if _END_LABEL.fullmatch(label)}  # input_1, output_2
    save_labels -= ends
    state = CaptureState({}, {}, False, save_labels)
    state.light = {}
    keep = next((p.keep for p in parts if p.light and p.keep is not None), None)
    if keep is not None:
        state.keep = keep
    session = Session(request, state, [t for _, t in _input_leaves(args, kwargs)])
    for part in parts:
        part.start(session)
    seam = combine(parts)
    if seam is not None:
        _plug(state, seam)
    if ends:  # numbered as the full trace numbers them, the inputs before the forward runs
        _keep_ends(state, "input", session.inputs, ends)
    runner = next((p for p in parts if p.runs), None)
    modules = inv.modules
    if not save_labels and state.seam is None:  # no op label to number: frames only where
        # a module's output is kept or edited (a patching cell's forward)
        acting = save_modules | set(seam.modules if seam is not None else ())
        modules = [(address, m) for address, m in modules if address in acting]
    handles = [] if runner is not None else \
        install_boundaries(modules, state, session.calls, save_modules, seam)
    _active.depth = getattr(_active, "depth", 0) + 1
    t0 = time.perf_counter_ns()
    try:
        if runner is not None:
            out = runner.run(session, combine([p for p in parts if p is not runner]))
            state.light.update(session.values)
        else:
            counting = LightRecorder(state) if save_labels or state.seam is not None else \
                contextlib.nullcontext()
            with quiet_hooks(model, inv.hooked, state), eager(), counting:
                out = model(*args, **kwargs)
        if ends:
            _keep_ends(state, "output", leaves(out, []), ends)
    finally:
        _active.depth -= 1
        for h in handles:
            h.remove()
    session.capture_ns = time.perf_counter_ns() - t0
    session.output, session.values = out, state.light
    for part in parts:
        part.end(session)
    result = runner.trace(session) if runner is not None else None
    if result is None:
        result = Trace([], {}, {}, {}, {"type": "value", "repr": None},
                       {"schema_version": SCHEMA_VERSION, "model_class": type(model).__name__,
                        "light": True, "capture_ns": session.capture_ns},
                       provenance=request.provenance)
    if request.keep_output:
        result._objects["forward_output"] = out
    for part in parts:
        part.finish(result, session)
    return result


_END_LABEL = re.compile(r"(input|output)_\d+")


def _keep_ends(state: CaptureState, kind: str, tensors: list, labels: set[str]) -> None:
    """Keep the selected ones of the forward's input or output tensors (``input_1``, ...)."""
    for n, t in enumerate(tensors, 1):
        if f"{kind}_{n}" in labels:
            state.light[f"{kind}_{n}"] = state.keep(f"{kind}_{n}", t)


def _dims(shape) -> list:
    """A shape as a list of ints, None for a nested tensor's ragged (symbolic) dimension."""
    return [d if type(d) is int else None for d in shape]


def _stack(frame: list, stacks: dict[int, list[str]]) -> list[str]:
    """The module calls enclosing ``frame`` and itself, outermost first ("address:pass")."""
    stack = stacks.get(id(frame))
    if stack is None:
        parent = frame[6]
        stack = [] if parent is None else [*_stack(parent, stacks), f"{frame[0]}:{frame[1]}"]
        stacks[id(frame)] = stack
    return stack


def _leaf_record(state, kind, label, t, parents, slot) -> OpRecord:
    return OpRecord(kind, state.frames[0], parents, (), (), t.shape, t.dtype, t.device, None,
                    None, False, False, None, 0, label, kind, slot)


def _input_leaves(args: tuple, kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """(slot, tensor) of every input tensor, in the order ``input_1``, ``input_2``, ... number
    them."""
    out: list[tuple[str, torch.Tensor]] = []
    for slot, value in [(str(i), a) for i, a in enumerate(args)] + list(kwargs.items()):
        found = leaves(value, [])
        out.extend((slot if len(found) == 1 else f"{slot}[{j}]", t) for j, t in enumerate(found))
    return out


def _add_inputs(state: CaptureState, args: tuple, kwargs: dict) -> None:
    for n, (slot, t) in enumerate(_input_leaves(args, kwargs), 1):
        index = len(state.records)
        state.records.append(_leaf_record(state, "input", f"input_{n}", t, [], slot))
        if state.save_all or f"input_{n}" in state.save_labels:
            state.values[index] = snapshot(t)
        state.register(t, index)


_PLAIN = (bool, int, float, str)


def _output_node(state: CaptureState, value: Any, path: str, depth: int, counter: list) -> dict:
    """The output structure's node for ``value``; a tensor gets an output record. ``counter``:
    [outputs numbered so far, the (output, op) records whose op saved the very tensor, or None
    when a leading part settles the values: then each output is copied]. (A module function,
    not a closure calling itself: such a closure is a reference cycle that would keep the
    capture's state alive until the collector runs.)"""
    if isinstance(value, torch.Tensor):
        counter[0] += 1
        label = f"output_{counter[0]}"
        producer = state.producer(value)
        index = len(state.records)
        state.records.append(_leaf_record(
            state, "output", label, value,
            [producer] if producer is not None else [], path or "output"))
        if state.keep_outputs:
            if counter[1] is None or state.held is None or type(value) is not torch.Tensor \
                    or value.is_meta:
                state.values[index] = snapshot(value)
            elif producer is not None and state.values.get(producer) is value:
                counter[1].append((index, producer))  # its op's saved value, once settled
            else:  # by reference, as a saved op's: copied when the capture ends only if the
                # model (its state, a cache) still holds it
                state.held.keep(index, value, weakref.ref(value), value._base is not None)
        return {"type": "tensor", "label": label}
    if depth < 8 and isinstance(value, Mapping):
        keys = [k if isinstance(k, _PLAIN) else str(k) for k in value]
        return {"type": "dict", "cls": type(value).__name__, "keys": keys,
                "items": [_output_node(state, value[k], f"{path}[{k!r}]", depth + 1, counter)
                          for k in value]}
    if depth < 8 and isinstance(value, (tuple, list)):
        return {"type": "list" if isinstance(value, list) else "tuple",
                "cls": type(value).__name__,
                "items": [_output_node(state, v, f"{path}[{i}]", depth + 1, counter)
                          for i, v in enumerate(value)]}
    if depth < 8 and (items := fields_of(value)) is not None:  # a dataclass: its fields
        return {"type": "dict", "cls": type(value).__name__, "keys": [k for k, _ in items],
                "items": [_output_node(state, v, f"{path}.{k}", depth + 1, counter)
                          for k, v in items]}
    node = {"type": "value", "cls": type(value).__name__, "repr": repr(value)[:200]}
    if value is None or isinstance(value, _PLAIN):
        node["value"] = value  # JSON-safe: saved as it is
    else:
        node["object"] = len(state.output_objects)  # kept in memory, never saved
        state.output_objects.append(value)
    return node


def _build(model, inv: Inventory, state, calls, structure, elapsed_ns, save, provenance,
           is_partial=False, homes=None) -> Trace:
    """The Trace of a finished (or failed) forward: its meta now, its objects on first use.

    Everything the objects are made from is fixed here (the parameters' facts too), so a model
    changed after the capture does not change its trace.
    """
    if state.advisories:  # the forward created parameters or modules: list them too
        inv = inventory(model)
    # (shape, dtype, device, trainable, lazy) per parameter, equal facts kept once: a model of
    # many like layers leaves the collector a few objects to scan, not two per parameter
    shared: dict[tuple, tuple] = {}
    param_facts = [shared.setdefault(f, f) for f in (
        (p.shape, p.dtype, p.device, p.requires_grad, False)
        if type(p) is Parameter or not is_lazy(p) else (None, None, None, p.requires_grad, True)
        for _, p in inv.params)]
    buffer_facts = [(name, b.shape, b.dtype, b.device) for name, b in inv.buffers
                    if not is_lazy(b)]
    train_bn = [address for address, module in inv.modules
                if isinstance(module, _NORM) and module.training and module.track_running_stats]
    meta = {
        "schema_version": SCHEMA_VERSION,
        "torchlens_version": _tl_version,
        "torch_version": torch.__version__,
        "model_class": type(model).__name__,
        "training": bool(model.training),
        "grad_enabled": torch.is_grad_enabled(),
        "save": save if isinstance(save, (str, type(None))) else sorted(save),
        "capture_ns": elapsed_ns,
        "partial": is_partial,
        "root_params": sum([prod(f[0]) for f in param_facts if not f[4]]),
        "train_mode_batchnorm": train_bn,
        "op_time": time_kind(set(map(_DEVICE, state.records))),
    }
    # the recorder's working sets
    state.tensors = state.writes = state.data_aliases = state.held = state.shapes = None
    modules = {address: type(module).__name__ for address, module in inv.modules if address}
    built = functools.partial(_objects, state, calls, modules, [name for name, _ in inv.params],
                              param_facts, buffer_facts, inv.aliases, homes or {})
    return Trace.deferred(built, len(state.records),
                          structure or {"type": "value", "repr": None}, meta,
                          provenance=provenance,
                          annotations={"capture_advisories": list(state.advisories)})


def time_kind(devices: set) -> str:
    """What an op's ``time_ns`` measures, given the devices its outputs were on."""
    if any(getattr(d, "type", d) == "cuda" for d in devices):
        return ("host: wall time of each call on the host; CUDA kernels run asynchronously, so "
                "on CUDA this is launch time, not kernel time (the capture never synchronizes)")
    return "host: wall time of each call (on CPU, the time the op computed)"


def _objects(state, calls, module_classes, param_names, param_facts, buffer_facts, aliases,
             homes) -> tuple:
    """(ops, modules, params, buffers) of a capture, from its records."""
    records = state.records
    ops: list[Op] = []
    children: list[list[int]] = [[] for _ in records]
    for i, rec in enumerate(records):
        parents = field.parents(rec)
        if type(parents) is int:
            children[parents].append(i)
        else:
            for p in parents:
                children[p].append(i)
    module_outputs: dict[int, list[str]] = {}
    for address, pass_num, _, _, _, _, _, _, outs in calls:
        for index in {i for i, _ in outs}:
            module_outputs.setdefault(index, []).append(f"{address}:{pass_num}")
    labels: list[str] = []
    values = state.values
    names: dict[Any, str] = {}  # str() of each dtype and device once, not once per op
    stacks: dict[int, list[str]] = {}
    weights: dict[str, Any] | None = None  # parameter name -> shape, made on first use
    for i, rec in enumerate(records):
        (func, frame, parents, params_used, buffers_used, shape, dtype, device, out_shapes, nbytes,
         inplace, is_view, flops, time_ns, label, kind, slot) = rec
        if kind == "op":
            if label is None:
                label, base, pass_num = state.label_for(func, frame)
            else:
                base, pass_num = split_pass(label)
                pass_num = pass_num or 1
        else:
            base, pass_num = label, 1
        labels.append(label)
        if nbytes is None:
            nbytes = prod(shape) * dtype.itemsize
        if type(flops) is str:  # the weight is this parameter
            if weights is None:
                weights = {n: f[0] for n, f in zip(param_names, param_facts)}
            flops = flops_of_weight(func, weights.get(flops), shape)
        elif flops is not None and type(flops) is not int:  # (an int: counted at the op)
            flops = flops_of(func, *flops, shape)
        dtype_name = names.get(dtype) or names.setdefault(dtype, str(dtype).removeprefix("torch."))
        device_name = names.get(device) or names.setdefault(device, str(device))
        shape = list(shape)
        if out_shapes is not None:  # a nested tensor's ragged dimension (j1) is None
            shape, out_shapes = _dims(shape), [_dims(s) for s in out_shapes]
        ops.append(Op(  # positional, in Op's field order: the fast path for big traces
            i, label, base, pass_num, kind, func,
            [labels[parents]] if type(parents) is int else [labels[p] for p in parents], [], shape,
            dtype_name, device_name,
            out_shapes if out_shapes is not None else [shape], nbytes,
            frame[0], frame[1], _stack(frame, stacks).copy(), module_outputs.get(i, []),
            list(params_used),
            list(buffers_used), time_ns, flops, inplace, is_view, slot, i in values, {},
            values.get(i),
        ))
    for op, kids in zip(ops, children):
        if kids:
            op.children = [labels[c] for c in kids]
    used_by: dict[str, list[str]] = {}
    for op in ops:
        for name in op.params + op.buffers:
            used_by.setdefault(name, []).append(op.label)
    params = {}
    owned: dict[str, int] = {}  # parameter count of each module's own parameters
    for name, (shape, dtype, device, trainable, lazy) in zip(param_names, param_facts):
        module = name.rpartition(".")[0]
        if lazy:
            params[name] = {"shape": None, "dtype": None, "device": None, "numel": 0,
                            "nbytes": 0, "trainable": bool(trainable), "module": module,
                            "aliases": [], "used_by": [], "lazy": True}
            continue
        numel = prod(shape)
        params[name] = {
            "shape": list(shape),
            "dtype": names.get(dtype) or names.setdefault(dtype, str(dtype).removeprefix("torch.")),
            "device": names.get(device) or names.setdefault(device, str(device)),
            "numel": numel, "nbytes": numel * dtype.itemsize,
            "trainable": trainable, "module": module,
            "aliases": aliases.get(name, []), "used_by": used_by.get(name, []),
        }
        if name in homes:
            params[name]["home"] = homes[name]
        owned[module] = owned.get(module, 0) + numel
    buffers = {}
    for name, shape, dtype, device in buffer_facts:
        numel = prod(shape)
        buffers[name] = {
            "shape": list(shape),
            "dtype": names.get(dtype) or names.setdefault(dtype, str(dtype).removeprefix("torch.")),
            "device": names.get(device) or names.setdefault(device, str(device)),
            "numel": numel, "nbytes": numel * dtype.itemsize, "module": name.rpartition(".")[0],
            "used_by": used_by.get(name, []),
        }
    recursive: dict[str, int] = {}  # parameters of each module and everything below it
    for module, numel in owned.items():
        while True:
            recursive[module] = recursive.get(module, 0) + numel
            if not module:
                break
            module = module.rpartition(".")[0]
    by_address: dict[str, list[ModuleCall]] = {}
    for address, pass_num, _, start, time_ns, module, _, end, outs in sorted(
            calls, key=lambda c: (c[0], c[1])):
        by_address.setdefault(address, []).append(ModuleCall(
            address, pass_num, type(module).__name__, labels[start:end],
            [labels[i] for i, _ in outs], time_ns, positions=[pos for _, pos in outs]))
    modules = {}
    for address, cls in module_classes.items():
        modules[address] = Module(address, cls, address.count(".") + 1,
                                  recursive.get(address, 0), by_address.get(address, []))
    return ops, modules, params, buffers


def _attach_failure(exc: BaseException, state: CaptureState, partial: Trace) -> None:
    failure = state.failure
    last = partial.ops[-1].label if partial.ops else None
    if isinstance(exc, TorchLensError):  # TorchLens refused (an edit, say), not the model
        where = (f"torchlens: TorchLens refused this forward ({exc.code}) "
                 f"{f'after op {last!r}' if last else 'before its first op'}, not the model; ")
    elif failure is not None:
        where = (
            f"torchlens: the forward raised in op #{failure['after_op'] + 1} "
            f"'{failure['func']}' (inputs {format_shapes(failure['input_shapes'])}) in module "
            f"'{failure['module'] or '<model>'}' (pass {failure['module_pass']}); "
        )
    else:
        where = f"torchlens: the forward raised outside a torch call, after op '{last or 'none'}'; "
    note = where + f"the partial trace ({len(partial)} ops) is on err.partial_trace"
    try:
        exc.partial_trace = partial  # type: ignore[attr-defined]
        exc.torchlens_failure = failure  # type: ignore[attr-defined]
        add_note(exc, note)
    except (AttributeError, TypeError):
        pass
