"""The model's modules, parameters and buffers from ONE traversal.

``named_modules``/``named_parameters``/``named_buffers`` each walk the whole tree through nested
generators; a capture needs all three (and parameter aliases), so it walks once. Names and order
match torch's own functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor, nn
from torch.nn.parameter import is_lazy


@dataclass
class Inventory:
    modules: list[tuple[str, nn.Module]] = field(default_factory=list)  # named_modules()
    params: list[tuple[str, Tensor]] = field(default_factory=list)  # named_parameters()
    buffers: list[tuple[str, Tensor]] = field(default_factory=list)  # named_buffers()
    aliases: dict[str, list[str]] = field(default_factory=dict)  # first name -> other names

    def pending_lazy(self) -> dict[str, str]:
        """Names of un-materialized lazy parameters and buffers (name -> 'parameter'/'buffer')."""
        found = {name: "parameter" for name, p in self.params if is_lazy(p)}
        found.update({name: "buffer" for name, b in self.buffers if is_lazy(b)})
        return found


def inventory(model: nn.Module) -> Inventory:
    """Modules (first address of each), parameters and buffers (each tensor once, under its
    first name) and the other names a tied parameter is reachable by."""
    inv = Inventory()
    seen_modules: set[int] = set()
    first_param: dict[int, str] = {}
    seen_buffers: set[int] = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        prefix, module = stack.pop()
        if id(module) not in seen_modules:
            seen_modules.add(id(module))
            inv.modules.append((prefix, module))
        dot = prefix + "." if prefix else ""
        for key, p in module._parameters.items():
            if p is None:
                continue
            name = dot + key
            first = first_param.setdefault(id(p), name)
            if first == name:
                inv.params.append((name, p))
            else:
                inv.aliases.setdefault(first, []).append(name)
        for key, b in module._buffers.items():
            if b is not None and id(b) not in seen_buffers:
                seen_buffers.add(id(b))
                inv.buffers.append((dot + key, b))
        children = [(dot + key, child) for key, child in module._modules.items()
                    if child is not None]
        stack.extend(reversed(children))
    return inv
