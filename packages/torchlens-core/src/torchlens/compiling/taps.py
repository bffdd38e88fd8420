"""The compiled taps: a light capture's part that runs the forward through ``torch.compile``
with the selected values as extra outputs of its graph. A torch function mode counts the calls
of the wanted functions' names (dynamo traces it into the graph, so it costs nothing per
forward), keeps the values of the located calls and hands them to the other parts' ``op`` (an
edit runs inside the graph); module sites are forward hooks, traced the same way."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from ..capture.boundaries import leaves
from ..capture.seam import Part
from ..sites import name_of
from .compiler import Compiler
from .locate import ENDS, Located, Place, wanted
from .values import with_values


class _NoRecords:
    """The capture state a module seam gets in a compiled forward: no op made any value."""

    @staticmethod
    def made_by(value: Any) -> None:
        return None


class _Taps(TorchFunctionMode):
    """Counts the calls of ``funcs``; at a wanted one, hands its output to ``seam`` and keeps
    it under its label when ``keep`` holds its base."""

    def __init__(self, funcs: dict, want: dict[tuple[str, int], Place], seam: Any,
                 keep: set[str], values: dict[str, Any]):
        super().__init__()
        self.funcs, self.want, self.seam, self.keep, self.values = funcs, want, seam, keep, values
        self.counts: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = self.funcs.get(func)
        if name is None:
            return out
        n = self.counts[name] = self.counts.get(name, 0) + 1
        place = self.want.get((name, n))
        if place is None:
            return out
        base = name_of(place.label)
        seam = self.seam
        if seam is not None and base in seam.ops:
            first = args[0] if args else None
            out = seam.op(out, place.label, base, place.pass_num, [place.address, place.pass_num],
                          name, args, kwargs, None, out is first and name.endswith("_"))
        if base in self.keep or place.label in self.keep:
            self.values[place.label] = out.detach() if isinstance(out, Tensor) else out
        return out


class CompiledTaps(Part):
    """Runs a light capture's forward compiled by ``compiler``, tapping the op labels ``located``
    placed and the module addresses asked for; the values (as the taps' ``keep`` makes them, on
    ``session.values``) are those of the eager light capture, within the kernels' tolerance."""

    light = True
    runs = True
    keep = None  # the values are kept as the capture's Taps keep them

    def __init__(self, compiler: Compiler, located: Located, labels: list[str],
                 modules: list[str]):
        self.compiler, self.located = compiler, located
        self.labels, self.addresses = list(labels), list(modules)
        self.raw: dict[str, Any] = {}

    def run(self, session: Any, seam: Any) -> Any:
        request = session.request
        bases = {name_of(label) for label in self.labels} | set(seam.ops if seam else ())
        raw: dict[str, Any] = {}
        taps = _Taps(self.located.funcs, wanted(self.located, bases), seam, set(self.labels),
                     raw)
        model: nn.Module = request.model
        named = dict(model.named_modules())
        hooked = set(self.addresses) | set(seam.modules if seam is not None else ())
        handles = [named[address].register_forward_hook(self._hook(address, seam, raw))
                   for address in hooked if address in named]
        try:
            with taps:  # a compiled module's own model, compiled by this call's compiler
                out = self.compiler(getattr(model, "_orig_mod", model), request.args,
                                    request.kwargs)
        finally:
            for handle in handles:
                handle.remove()
        keep = session.state.keep
        self.raw = raw
        session.values.update({key: keep(key, value) for key, value in raw.items()})
        return out

    def _hook(self, address: str, seam: Any, raw: dict[str, Any]):
        passes = [0]
        save = address in self.addresses
        edit = seam is not None and address in seam.modules

        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            passes[0] += 1
            if edit:
                output = seam.module(_NoRecords, address, passes[0], args, output)
            if save:
                found = leaves(output, [])
                if found:
                    key = address if passes[0] == 1 else f"{address}:{passes[0]}"
                    raw[key] = found[0].detach() if len(found) == 1 else \
                        [t.detach() for t in found]
            return output if edit else None
        return hook


class CompiledStructure(CompiledTaps):
    """Compiled taps whose capture's Trace is the eager capture's graph (``located.trace``)
    holding the compiled forward's values at the sites (``tl.trace(..., compile=...)``)."""

    def trace(self, session: Any) -> Any:
        ends = {k: v for k, v in session.values.items() if ENDS.fullmatch(k)}
        return with_values(self.located.trace, {**self.raw, **ends}, session.capture_ns)
