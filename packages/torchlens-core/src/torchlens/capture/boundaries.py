"""Module-call boundaries: a frame opens when a submodule's forward starts and closes on its output.

An ordinary submodule's call is caught where ``nn.Module.__call__`` looks for a compiled call
(``_compiled_call_impl``, which ``module.compile()`` sets): for the length of the capture it is
an instance attribute, removed after, that opens the frame and calls the module's own
``_call_impl``, which keeps its hook-free fast path. One process-wide hook would send every
module call of the forward through torch's slow path, which costs more than the frame itself;
wrapping ``forward`` would also catch ``self.forward(v)`` called directly, which is no module
call (for torch's hooks neither), and telling the two apart costs a look at the caller's frame;
a deep copy of the module made inside the forward would carry a wrapped ``forward`` (torch's
copy leaves the compiled call out). A submodule with hooks of its own, or a lazy one still to
materialize, gets hooks registered after the user's instead: its frame opens after the user's
pre-hooks ran and closes on the output the user's forward hooks return. While the user has
process-wide forward hooks, every call takes the slow path anyway and their order matters, so
process-wide hooks then serve the ordinary submodules. Wrappers and hooks act only for calls
in the capturing thread (the recorder's mode is per thread too): a call another thread makes
passes straight through, also one that entered a wrapper before its capture ended.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from functools import partial
from threading import get_ident
from typing import Any

import torch
from torch._C import DisableTorchFunction
from torch.nn.modules import module as _module
from torch.nn.modules.lazy import LazyModuleMixin

from .record import field
from .recorder import snapshot

_MISSING = object()
# the instance attribute ``nn.Module.__call__`` calls instead of ``_call_impl`` when it is set
_CALL = "_compiled_call_impl"
_ATOMS = frozenset({type(None), bool, int, float, complex, str, bytes})  # hold no tensor


def leaves(value: Any, found: list, depth: int = 0) -> list:
    """Every tensor in nested tuples, lists, mappings and dataclasses (appended to ``found``,
    returned)."""
    # runs on every module call's output that is not one tensor: the common shapes (a tuple,
    # None, a number) are settled before the abstract ``Mapping`` check, which costs more
    kind = type(value)
    if kind is tuple or kind is list:
        if depth <= 6:
            for item in value:
                if type(item) is torch.Tensor:
                    found.append(item)
                elif item is not None:
                    leaves(item, found, depth + 1)
        return found
    if isinstance(value, torch.Tensor):
        found.append(value)
    elif depth > 6 or kind in _ATOMS:
        return found
    elif isinstance(value, Mapping):
        for item in value.values():
            leaves(item, found, depth + 1)
    elif isinstance(value, (tuple, list)):
        for item in value:
            leaves(item, found, depth + 1)
    elif (items := fields_of(value)) is not None:
        for _, item in items:
            leaves(item, found, depth + 1)
    return found


def fields_of(value: Any) -> list[tuple[str, Any]] | None:
    """A dataclass instance's (field name, value) pairs; None for anything else."""
    if not hasattr(type(value), "__dataclass_fields__") or isinstance(value, type):
        return None
    return [(f.name, getattr(value, f.name, None)) for f in dataclasses.fields(value)]


class _Unwrap:
    """The handle of the wrapped calls: ``remove()`` leaves each module's call as it was.
    ``bind`` (set by ``install``) points every frame at another capture's state."""

    def __init__(self) -> None:
        self.wrapped: list[tuple[dict, Any, Any]] = []  # (instance dict, before, wrapper)
        self.bind: Any = None
        self.reusable = False  # no process-wide hooks and no lazy module: may be kept (Kept)
        self.made_for: tuple = ()  # (modules, save_modules, plan) it was installed for

    def current(self, modules: list, save_modules: set[str], plan: Any) -> bool:
        """Whether these frames still serve a capture of ``modules``: each wrapped call is
        still this one's and its module has gained no hooks (which take the hook route)."""
        was_modules, was_saved, was_plan = self.made_for
        if modules is not was_modules or save_modules != was_saved or plan is not was_plan \
                or _module._global_forward_pre_hooks or _module._global_forward_hooks:
            return False
        return all(attrs.get(_CALL) is wrapper and not attrs.get("_forward_pre_hooks") and
                   not attrs.get("_forward_hooks") for attrs, _, wrapper in self.wrapped)

    def remove(self) -> None:
        for attrs, before, wrapper in reversed(self.wrapped):
            if attrs.get(_CALL) is not wrapper:
                continue  # replaced during the capture by someone else: theirs stays
            if before is _MISSING:
                del attrs[_CALL]
            else:
                attrs[_CALL] = before
        self.wrapped.clear()


def install(named_modules, state, calls: list, save_modules: set[str], plan: Any = None) -> list:
    """Open and close a frame around each submodule call; returns handles to ``remove()``.

    A frame is ``[address, pass, name counters, first record, start ns, module, enclosing
    frame]``; a finished call's frame, its start turned into its time and extended by its end
    record and its outputs, goes to ``calls``. ``save_modules`` are addresses whose outputs are
    kept. ``plan``: an edit plan naming module sites; each call of those modules passes its
    output through ``plan.module`` before its frame closes (the other modules' calls are as
    they would be without it). The first handle's ``bind`` points the frames at a later
    capture's state, so that a run of captures keeps them installed (``Kept``).
    """
    handles: list = []
    counts: dict[str, int] = {}
    frames, records, tensors = state.frames, state.records, state.tensors
    addresses: dict[int, str] = {}  # submodules the process-wide hooks serve
    clock = time.perf_counter_ns
    owner = get_ident()

    def opened(mod, address):
        n = counts.get(address, 0) + 1
        counts[address] = n
        frames.append([address, n, None, len(records), clock(), mod, frames[-1]])

    def closed(mod, output, address):
        # runs between two ops of the user's forward, like the recorder: kept short
        if frames[-1][0] == address:
            frame = frames.pop()
        else:  # an inner call's frame is still open (a hook that saw no end of it)
            frame = _pop_frame(frames, address)
            if frame is None:
                return
        outs = outputs_of(frame, output, address)
        if outs is None:  # a light capture's frame: nothing to keep
            return
        frame[4] = clock() - frame[4]
        frame += (len(records), outs)
        calls.append(frame)

    def outputs_of(frame, output, address):
        """(record index, which tensor of its output) of each output tensor a recorded op made;
        None for a light capture, which keeps a selected module's output here instead."""
        found = [output] if type(output) is torch.Tensor else leaves(output, [])
        if state.light is not None:
            if address in save_modules and found:
                key = address if frame[1] == 1 else f"{address}:{frame[1]}"
                state.light[key] = state.keep(key, found[0] if len(found) == 1 else found)
            return None
        if not state.writes and not save_modules:  # nothing written in place: no version check
            return [(e[0], e[3]) for t in found
                    if (e := tensors.get(id(t))) is not None and e[1]() is t]
        with DisableTorchFunction():  # tensor attributes here would go through the recorder
            outs = [(e[0], e[3]) if t._version == e[2] else _written_output(state, t, e)
                    for t in found if (e := tensors.get(id(t))) is not None and e[1]() is t]
            if save_modules and address in save_modules:
                _keep_values(state, found)
        return outs

    def served(mod, address):
        """The address a hook call is for (a module's own hooks pass it), or None: another
        thread's call, or a module the process-wide hooks do not serve."""
        if get_ident() != owner:
            return None
        return addresses.get(id(mod)) if address is None else address

    def pre(mod, args, address=None):
        own = address is not None  # the module's own hook: a lazy one's pause ends here
        address = served(mod, address)
        if address is None:
            return
        if own:
            resume(mod)
        opened(mod, address)

    def post(mod, args, output, address=None):
        if address is not None and get_ident() == owner:
            resume(mod)  # a lazy one's initialization raised before ``pre`` ran
        address = served(mod, address)
        if address is not None:
            if edited is not None and address in edited:
                output = plan.module(state, address, counts[address], args, output)
                closed(mod, output, address)
                return output  # torch's hook contract: what a forward hook returns is the output
            closed(mod, output, address)

    def resume(mod):
        """End a lazy module's pause of the recorder, if it is still paused."""
        if getattr(mod, "_torchlens_paused", False):
            state.suspended -= 1
            del mod._torchlens_paused

    def pause(mod, args):
        # a lazy module: runs before its own initializing pre-hook; ``pre`` ends the pause
        if get_ident() != owner:
            return
        state.suspended += 1
        mod._torchlens_paused = True

    def editing(address, inner):
        """``inner`` with the plan's edits of this module applied to its output."""
        def call(*args, **kwargs):
            output = inner(*args, **kwargs)
            if get_ident() != owner:
                return output
            return plan.module(state, address, counts[address], args, output)

        return call

    def wrap(mod, address, inner):
        if edited is not None and address in edited:
            inner = editing(address, inner)
        if labels_only:
            def call(*args, **kwargs):
                # a light capture selecting no module: the frame only numbers the labels inside
                if get_ident() != owner:
                    return inner(*args, **kwargs)
                n = counts.get(address, 0) + 1
                counts[address] = n
                frames.append([address, n, None, 0, 0, mod, frames[-1]])
                try:
                    return inner(*args, **kwargs)
                finally:
                    if frames[-1][0] == address:
                        frames.pop()
                    else:
                        _pop_frame(frames, address)
        else:
            def call(*args, **kwargs):
                if get_ident() != owner:  # another thread's call
                    return inner(*args, **kwargs)
                n = counts.get(address, 0) + 1  # opened(), inline: it runs once per module call
                counts[address] = n
                frame = [address, n, None, len(records), clock(), mod, frames[-1]]
                frames.append(frame)
                try:
                    output = inner(*args, **kwargs)
                except BaseException:  # the call ends without an output (a caller may catch it)
                    closed(mod, None, address)
                    raise
                if plain and not writes and frames[-1] is frame:
                    frames.pop()  # closed(), inline while nothing was written in place
                    if type(output) is Tensor:
                        e = tensors.get(id(output))
                        outs = [(e[0], e[3])] if e is not None and e[1]() is output else []
                    else:
                        outs = [(e[0], e[3]) for t in leaves(output, [])
                                if (e := tensors.get(id(t))) is not None and e[1]() is t]
                    frame[4] = clock() - frame[4]
                    frame += (len(records), outs)
                    calls.append(frame)
                else:
                    closed(mod, output, address)
                return output

        call._torchlens_frames = True
        return call

    edited = plan.modules if plan is not None else None
    labels_only = state.light is not None and not save_modules
    plain = state.light is None and not save_modules  # a frame closes on its output's op alone
    writes = state.writes
    Tensor = torch.Tensor
    process_wide = bool(_module._global_forward_pre_hooks or _module._global_forward_hooks)
    unwrap = _Unwrap()
    handles.append(unwrap)
    try:
        for address, module in named_modules:
            lazy = isinstance(module, LazyModuleMixin) and module.has_uninitialized_params()
            if lazy:
                handles.append(module.register_forward_pre_hook(pause, prepend=True))
            if not address:
                continue
            if lazy or module._forward_pre_hooks or module._forward_hooks:
                handles.append(module.register_forward_pre_hook(partial(pre, address=address)))
                handles.append(module.register_forward_hook(partial(post, address=address),
                                                            always_call=True))
            elif process_wide or isinstance(module, torch.jit.ScriptModule) or getattr(
                    module.__dict__.get(_CALL), "_torchlens_frames", False):
                # (another capture, in another thread or around this one, wrapped it: it
                # unwraps its own, so this one does not stack on top)
                addresses[id(module)] = address
            else:
                attrs = module.__dict__
                before = attrs.get(_CALL, _MISSING)
                # torch's own call, or the one ``module.compile()`` set (eager in a capture)
                wrapper = wrap(module, address, module._call_impl
                               if before is _MISSING or before is None else before)
                unwrap.wrapped.append((attrs, before, wrapper))
                attrs[_CALL] = wrapper
        if addresses:
            handles.append(_module.register_module_forward_pre_hook(pre))
            handles.append(_module.register_module_forward_hook(post, always_call=True))
    except BaseException:  # the user's model is left as it was found
        for handle in handles:
            handle.remove()
        raise

    def bind(new_state, new_calls):
        # the closures above read these cells: a later capture of the same modules takes the
        # frames over by rebinding them (no capture at all while ``owner`` is None)
        nonlocal state, calls, counts, frames, records, tensors, writes, owner
        state, calls, counts = new_state, new_calls, {}
        frames, records, tensors = new_state.frames, new_state.records, new_state.tensors
        writes = new_state.writes
        owner = None if new_state is _IDLE else get_ident()

    unwrap.bind = bind
    unwrap.reusable = not addresses and not any(
        isinstance(m, LazyModuleMixin) for _, m in named_modules) and state.light is None
    unwrap.made_for = (named_modules, set(save_modules), plan)
    return handles


class Kept:
    """Frames installed once for a run of captures of one model (a step run's steps) and kept
    between them: each capture binds them to its own state; frames that no longer serve
    (the model read again, a module given hooks or compiled) are installed again.
    ``remove()`` when the run ends; between captures the frames pass every call through."""

    def __init__(self) -> None:
        self.handles: list | None = None

    def open(self, modules: list, state: Any, calls: list, save_modules: set[str],
             plan: Any) -> list:
        """The frames for one capture (as ``install`` makes them): the kept ones bound to its
        state when they still serve, else newly installed (and kept when they can be)."""
        handles = self.handles
        if handles is not None and handles[0].current(modules, save_modules, plan):
            handles[0].bind(state, calls)
            return handles
        self.remove()
        handles = install(modules, state, calls, save_modules, plan)
        self.handles = handles if handles[0].reusable else None
        return handles

    def close(self, handles: list) -> None:
        """End one capture: kept frames stop capturing, others are removed."""
        if handles is self.handles:
            handles[0].bind(_IDLE, [])
        else:
            for handle in handles:
                handle.remove()

    def remove(self) -> None:
        """Take the kept frames off the model (the run ended, or a step runs without them)."""
        if self.handles is not None:
            for handle in self.handles:
                handle.remove()
            self.handles = None


class _Idle:
    """The state kept frames point at between captures (their owner is no thread)."""

    frames = records = tensors = None
    writes: dict = {}


_IDLE = _Idle()


def _keep_values(state: Any, found: list) -> None:
    """Save the values of the ops that made a saved module's output tensors ``found``. An op
    with several outputs keeps them all by position, as ``save="all"`` does; one the module did
    not return stays None."""
    several: dict[int, list] = {}  # op index -> its outputs by position (None: not returned)
    for t in found:
        index = state.producer(t)
        if index is None or index in state.values:
            continue
        shapes = field.out_shapes(state.records[index])
        if shapes is None:
            state.values[index] = snapshot(t)
            continue
        entry = state.tensors.get(id(t))
        position = entry[3] if entry is not None and entry[0] == index else 0
        outputs = several.setdefault(index, [None] * len(shapes))
        if outputs[position] is None:
            outputs[position] = t
    for index, outputs in several.items():
        state.values[index] = tuple(None if t is None else snapshot(t) for t in outputs)


def _pop_frame(frames: list, address: str) -> list | None:
    for i in range(len(frames) - 1, 0, -1):
        if frames[i][0] == address:
            return frames.pop(i)
    return None


def _written_output(state: Any, t: torch.Tensor, entry: tuple) -> tuple[int, int]:
    """(record, position) of an output tensor written in place since its op recorded it."""
    index = state.producer(t)
    return index, entry[3] if entry[0] == index else 0
