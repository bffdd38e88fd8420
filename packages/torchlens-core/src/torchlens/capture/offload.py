"""Models dispatched by accelerate (``dispatch_model``, ``cpu_offload``, ``disk_offload``,
``from_pretrained(device_map=...)``): hooks bring a module's weights in for its forward and take
them out after. That bookkeeping is not the model's computation, so the capture does not record
it; tensors the hooks move to another device keep their edges. accelerate is never imported.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from torch import Tensor, nn


def _alias(state: Any, before: Any, after: Any) -> None:
    """A tensor a hook moved stands for the one it was moved from (same producer)."""
    if isinstance(after, Tensor):
        if isinstance(before, Tensor) and after is not before:
            entry = state.tensors.get(id(before))
            if entry is not None and entry[1]() is before:
                state.register(after, entry[0], entry[3])
    elif isinstance(after, (tuple, list)) and isinstance(before, (tuple, list)):
        for a, b in zip(before, after):
            _alias(state, a, b)
    elif isinstance(after, Mapping) and isinstance(before, Mapping):
        for key, value in after.items():
            if key in before:
                _alias(state, before[key], value)


def _slots(model: nn.Module, state: Any) -> dict[tuple[int, str], tuple[dict, str]]:
    """(module, attribute) -> (the id table, the canonical name) of every parameter and buffer:
    a weight a hook brings in is a new tensor in the same slot, known by the slot's name."""
    slots = {}
    for module in model.modules():
        for table, tensors in ((state.param_ids, module._parameters),
                               (state.buffer_ids, module._buffers)):
            for local, t in tensors.items():
                if t is not None and id(t) in table:
                    slots[(id(module), local)] = (table, table[id(t)])
    return slots


class _Quiet:
    """Stands in for a module's accelerate hook during a capture: the recorder is suspended
    while the hook moves weights and tensors, and the weights it brings in keep their names."""

    def __init__(self, hook: Any, state: Any, slots: dict):
        self._hook, self._state, self._slots = hook, state, slots
        self._added: list[list[tuple[dict, int]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hook, name)

    def pre_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> tuple:
        self._state.suspended += 1
        try:
            new_args, new_kwargs = self._hook.pre_forward(module, *args, **kwargs)
        finally:
            self._state.suspended -= 1
        added = []
        for sub in module.modules():
            for tensors in (sub._parameters, sub._buffers):
                for local, t in tensors.items():
                    slot = self._slots.get((id(sub), local))
                    if t is not None and slot is not None and id(t) not in slot[0]:
                        slot[0][id(t)] = slot[1]
                        added.append((slot[0], id(t)))
        self._added.append(added)
        _alias(self._state, (args, kwargs), (new_args, new_kwargs))
        return new_args, new_kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        self._state.suspended += 1
        try:
            new = self._hook.post_forward(module, output)
        finally:
            self._state.suspended -= 1
        for table, key in self._added.pop() if self._added else ():
            table.pop(key, None)  # the weight went home: its id may be reused
        _alias(self._state, output, new)
        return new


@contextlib.contextmanager
def quiet_hooks(model: nn.Module, modules: list[nn.Module], state: Any) -> Iterator[None]:
    """Swap each hook for a quiet stand-in for the capture; the originals come back after."""
    swapped = [(m, m._hf_hook) for m in modules]
    slots = _slots(model, state) if swapped else {}
    for module, hook in swapped:
        module._hf_hook = _Quiet(hook, state, slots)
    try:
        yield
    finally:
        for module, hook in swapped:
            module._hf_hook = hook


def _offloaded(model: nn.Module, modules: list[nn.Module]) -> Iterator[tuple[str, str, Any]]:
    """(name, key in its hook's weights map, the map's store) of every offloaded parameter and
    buffer, through the modules whose accelerate hook offloads them."""
    owners = {id(m): name for name, m in model.named_modules()}
    for module in modules:
        hook = module._hf_hook
        weights = getattr(hook, "weights_map", None)
        if not getattr(hook, "offload", False) or weights is None:
            continue
        prefix = getattr(weights, "prefix", "")
        store = getattr(weights, "dataset", weights)
        base = owners.get(id(module), "")
        for local, _ in [*module.named_parameters(recurse=False),
                         *module.named_buffers(recurse=False)]:
            yield f"{base}.{local}" if base else local, f"{prefix}{local}", store


def _key(t: Tensor) -> tuple:
    return t.data_ptr(), t.dtype, tuple(t.shape), t.stride(), t.storage_offset()


def offloaded_ties(model: nn.Module, modules: list[nn.Module]) -> dict[str, str]:
    """``{alias: source}`` of offloaded parameters that are one tensor where accelerate keeps
    them: the same tensor in ``cpu_offload``'s state dict, the same tensor of the same
    checkpoint file in a ``device_map`` index. Each alias points at the first name seen."""
    first: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for name, key, store in _offloaded(model, modules):
        held = getattr(store, "state_dict", store)
        entry = (getattr(store, "index", None) or {}).get(key)
        if isinstance(held, Mapping) and isinstance(held.get(key), Tensor):
            where: tuple = ("memory", *_key(held[key]))
        elif isinstance(entry, Mapping) and entry.get("safetensors_file"):
            where = ("file", entry["safetensors_file"], entry.get("weight_name", key))
        else:
            continue
        source = first.setdefault(where, name)
        if source != name:
            out[name] = source
    return out


def _declared_ties(model: nn.Module) -> dict[str, str]:
    """``{alias: source}`` the model's library declares (plugins, e.g. transformers' tied keys)."""
    from ..plugins import hook

    out: dict[str, str] = {}
    for ties in hook().torchlens_tied_parameters(model=model):
        out.update(ties or {})
    return out


def tie_offloaded(model: nn.Module, inv: Any) -> None:
    """Count a tied parameter once when offloading split it into placeholders: an alias found in
    accelerate's store, or declared by the model, joins its source (``inv.aliases``, the id
    table); a declared tie between two resident, distinct tensors is not one and is ignored."""
    params = dict(inv.params)
    offloaded = {name for name, _, _ in _offloaded(model, inv.hooked)}
    ties = _declared_ties(model)
    ties = {a: s for a, s in ties.items() if a in offloaded or s in offloaded}
    ties.update(offloaded_ties(model, inv.hooked))
    order = {name: i for i, (name, _) in enumerate(inv.params)}

    def root(name: str) -> str:
        seen = set()
        while name in ties and name not in seen:
            seen.add(name)
            name = ties[name]
        return name

    merged: dict[str, str] = {}
    for alias in ties:
        a, s = alias, root(alias)
        if a == s or a not in params or s not in params:
            continue
        pa, ps = params[a], params[s]
        if pa.shape != ps.shape or pa.dtype != ps.dtype:
            continue
        merged[a] = s
    if not merged:
        return
    groups: dict[str, list[str]] = {}
    for alias, source in merged.items():
        groups.setdefault(source, [source]).append(alias)
    for names in groups.values():
        names.sort(key=order.__getitem__)
        head, rest = names[0], names[1:]
        for alias in rest:
            inv.param_ids[id(params[alias])] = head
            inv.aliases.setdefault(head, []).append(alias)
            inv.aliases.setdefault(head, []).extend(inv.aliases.pop(alias, []))
    dropped = {alias for names in groups.values() for alias in sorted(
        names, key=order.__getitem__)[1:]}
    inv.params[:] = [(name, p) for name, p in inv.params if name not in dropped]


def homes(model: nn.Module, modules: list[nn.Module]) -> dict[str, str]:
    """Where each offloaded parameter or buffer lives between forwards: "offloaded: disk" or
    "offloaded: cpu" (its module's hook holds it); others are absent (their device says)."""
    return {name: "offloaded: disk" if key in (getattr(store, "index", None) or {})
            else "offloaded: cpu" for name, key, store in _offloaded(model, modules)}


def sources(model: nn.Module, modules: list[nn.Module]
            ) -> tuple[list[tuple[str, Tensor]], list[tuple[str, str]]]:
    """Where the offloaded tensors' bytes are between forwards: (name, tensor) of those
    accelerate keeps in memory (``cpu_offload``'s state dict), (name, file) of those in files
    (``disk_offload``'s ``.dat`` files, a checkpoint's safetensors file)."""
    memory: list[tuple[str, Tensor]] = []
    files: list[tuple[str, str]] = []
    for name, key, store in _offloaded(model, modules):
        held = getattr(store, "state_dict", store)
        index = getattr(store, "index", None) or {}
        folder = getattr(store, "save_folder", None)
        if isinstance(held, Mapping) and isinstance(held.get(key), Tensor):
            memory.append((name, held[key]))
        elif key in index:
            path = index[key].get("safetensors_file") or (
                os.path.join(folder, f"{key}.dat") if folder is not None else None)
            if path is not None:
                files.append((name, str(path)))
    return memory, files


def file_state(path: str) -> tuple[int, int] | None:
    """(size, modification time in ns) of a file; None when it is gone."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_size, info.st_mtime_ns
