"""Where gradients will be read: at each op or module call ``save_grads=`` names, the gradient
edge of its output (the autograd node and output slot) as it was made, before any later
in-place write moves the tensor on. ``trace.backward`` asks autograd for these edges."""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch._C import DisableTorchFunction
from torch.autograd.graph import get_gradient_edge

from ..capture.boundaries import leaves
from ..capture.seam import EVERY_OP
from ..sites import Site, call_key


class Slot:
    """One tensor a gradient will be read for: the op (record index) that made it, which of
    its outputs, the gradient edge (None: it needs no gradient), and the live tensor with its
    version then (a target may be summed from it)."""

    __slots__ = ("index", "position", "edge", "value", "version")

    def __init__(self, index: int, position: int, edge: Any, value: Tensor):
        self.index, self.position, self.edge = index, position, edge
        self.value, self.version = value, value._version


class GradObserver:
    """The seam plug-in of ``save_grads=`` and ``grad_edits=``: notes the slots of their sites."""

    def __init__(self, sites: list[Site] | None, every: bool):
        self.every = every
        sites = sites or []
        self.ops: Any = EVERY_OP if every else {s.name for s in sites if s.kind == "op"}
        self.op_sites = [s for s in sites if s.kind == "op"]
        self.modules: dict[str, list[Site]] = {}
        for s in sites:
            if s.kind == "module":
                self.modules.setdefault(s.name, []).append(s)
        self.slots: dict[int, list[Slot]] = {}  # record index -> its tensors' slots
        self.calls: dict[str, list[int]] = {}  # "address:pass" -> record indices of its output

    def op(self, out: Any, label: str, base: str, pass_num: int, frame: Any, func: str,
           args: tuple, kwargs: dict, index: int | None, inplace: bool) -> Any:
        """The recorder's seam: note the gradient edge of a chosen op's output; ``out``
        unchanged."""
        if index is None or not (self.every or any(s.matches(base, pass_num)
                                                   for s in self.op_sites)):
            return out
        self._note(index, out)
        return out

    def module(self, state: Any, address: str, pass_num: int, args: tuple, output: Any) -> Any:
        """The module boundary's seam: note which ops' outputs a chosen module call returned."""
        if not any(s.pass_num in (None, pass_num) for s in self.modules[address]):
            return output
        indices = []
        with DisableTorchFunction():
            for t in leaves(output, []):
                made = state.made_by(t)
                if made is not None:
                    indices.append(made[0])
                    if made[0] not in self.slots:
                        self._slot(made[0], made[1], t)
        self.calls[call_key(address, pass_num)] = indices
        return output

    def inputs(self, state: Any, tensors: list[Tensor]) -> None:
        """The model's input tensors (``input_1``, ...), recorded before the forward ran."""
        for n, t in enumerate(tensors, 1):
            index = state.producer(t)
            if index is not None and (self.every or any(
                    s.matches(f"input_{n}", 1) for s in self.op_sites)):
                self._note(index, t)

    def _note(self, index: int, out: Any) -> None:
        with DisableTorchFunction():
            tensors = [out] if isinstance(out, Tensor) else [
                t for t in (out if isinstance(out, (tuple, list)) else ()) if isinstance(t, Tensor)]
            for position, t in enumerate(tensors):
                self._slot(index, position, t)

    def _slot(self, index: int, position: int, t: Tensor) -> None:
        edge = get_gradient_edge(t) if t.requires_grad else None
        self.slots.setdefault(index, []).append(Slot(index, position, edge, t))
