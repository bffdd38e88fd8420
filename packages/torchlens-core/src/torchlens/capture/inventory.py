"""The model's modules, parameters and buffers from ONE traversal.

``named_modules``/``named_parameters``/``named_buffers`` each walk the whole tree through nested
generators; a capture needs all three (and parameter aliases), so it walks once. Names and order
match torch's own functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from torch import Tensor, nn
from torch.jit import ScriptModule
from torch.nn import Parameter
from torch.nn.parameter import is_lazy


@dataclass
class Inventory:
    modules: list[tuple[str, nn.Module]] = field(default_factory=list)  # named_modules()
    paths: list[tuple[str, nn.Module]] = field(default_factory=list)  # module_paths()
    params: list[tuple[str, Tensor]] = field(default_factory=list)  # named_parameters()
    buffers: list[tuple[str, Tensor]] = field(default_factory=list)  # named_buffers()
    aliases: dict[str, list[str]] = field(default_factory=dict)  # first name -> other names
    lazy: dict[str, str] = field(default_factory=dict)  # pending lazy name -> parameter/buffer
    has_meta: bool = False  # some parameter or buffer is on the meta device
    param_ids: dict[int, str] = field(default_factory=dict)  # id -> first name
    buffer_ids: dict[int, str] = field(default_factory=dict)  # id -> first name
    hooked: list[nn.Module] = field(default_factory=list)  # modules with an accelerate hook
    scripted: list[str] = field(default_factory=list)  # outermost TorchScript modules

    @cached_property
    def addresses(self) -> tuple[str, ...]:
        """Every submodule's address (the root's empty one left out): what sites parse against."""
        return tuple(address for address, _ in self.modules if address)

    def pending_lazy(self) -> dict[str, str]:
        """Names of un-materialized lazy parameters and buffers (name -> 'parameter'/'buffer')."""
        return dict(self.lazy)


def module_paths(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``named_modules(remove_duplicate=False)``: every (address, module), a shared module under
    each of its addresses, in torch's order, without one generator per module."""
    out: list[tuple[str, nn.Module]] = []
    stack: list[tuple[str, nn.Module]] = [("", model)]
    pop, push, add = stack.pop, stack.append, out.append
    while stack:
        item = pop()
        add(item)
        children = item[1]._modules
        if children:
            dot = item[0] + "." if item[0] else ""
            for key, child in reversed(children.items()):
                if child is not None:
                    push((dot + key, child))
    return out


def inventory(model: nn.Module) -> Inventory:
    """Modules (first address of each), parameters and buffers (each tensor once, under its
    first name), the other names a tied parameter is reachable by, and the modules that carry an
    accelerate hook (an instance attribute: read from the instance dict, not through
    ``nn.Module.__getattr__``'s slow miss)."""
    inv = Inventory()
    modules, params, buffers, lazy = inv.modules, inv.params, inv.buffers, inv.lazy
    seen_modules: set[int] = set()
    first_param, seen_buffers = inv.param_ids, inv.buffer_ids
    has_meta = False
    inv.paths = module_paths(model)
    for prefix, module in inv.paths:
        attrs, identity = module.__dict__, id(module)
        if identity not in seen_modules:
            seen_modules.add(identity)
            modules.append((prefix, module))
            if attrs.get("_hf_hook") is not None:
                inv.hooked.append(module)
            if "_c" in attrs and isinstance(module, ScriptModule) and not any(
                    prefix.startswith(f"{outer}.") or not outer for outer in inv.scripted):
                inv.scripted.append(prefix)
        own, bufs = attrs["_parameters"], attrs["_buffers"]
        if not own and not bufs:
            continue
        dot = prefix + "." if prefix else ""
        for key, p in own.items():
            if p is None:
                continue
            name = dot + key
            first = first_param.setdefault(id(p), name)
            if first == name:
                params.append((name, p))
                if type(p) is not Parameter and is_lazy(p):
                    lazy[name] = "parameter"
                elif p.is_meta:
                    has_meta = True
            else:
                inv.aliases.setdefault(first, []).append(name)
        if bufs:
            for key, b in bufs.items():
                if b is not None and id(b) not in seen_buffers:
                    seen_buffers[id(b)] = dot + key
                    buffers.append((dot + key, b))
                    if is_lazy(b):
                        lazy[dot + key] = "buffer"
                    elif b.is_meta:
                        has_meta = True
    inv.has_meta = has_meta
    if inv.hooked:  # offloaded weights are placeholders per module: tied ones look untied
        from .offload import tie_offloaded

        tie_offloaded(model, inv)
    return inv
