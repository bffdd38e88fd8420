"""Rung-3 probe budgets: check a candidate on fake tensors before any real forward.

``budget_for(device)`` sets the bounds: a fraction of the memory available where the model lives,
a FLOP ceiling per probe and a wall-clock ceiling for the whole inference (the time bounds).
``precheck`` runs the forward on fake tensors (``FakeTensorMode``: shapes and dtypes, no data)
over a fake copy of the parameters, so nothing is allocated and the model's own tensors are never
touched; it measures the peak of live activation bytes and the FLOPs, and stops as soon as either
passes its bound. A forward fake tensors cannot follow (data-dependent Python, ``.item()``,
``.numpy()``) is "inconclusive"; ``guarded`` then sizes every op on the meta device just before
it runs for real, and stops the forward before the op that would pass the memory bound allocates
anything. ``check_save_budget`` refuses a ``save="all"`` recapture whose kept activations would
pass the memory bound.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from ..compiled import eager
from ..errors import OverBudget
from ..units import human

MEMORY_FRACTION = 0.25  # of the memory available where the model lives
MAX_FLOPS = {"cpu": 1e12, "cuda": 1e14}  # the time bound: ~a minute of CPU, seconds of GPU
MAX_SECONDS = 120.0  # no new probe starts after this much inference time


@dataclass
class Precheck:
    """A fake-tensor run of one candidate: ``outcome`` is fits, over_budget, failed or
    inconclusive; peak/flops are the measured estimates (a lower bound when it stopped)."""

    outcome: str
    peak_bytes: int = 0
    flops: int = 0
    error: BaseException | None = None
    total_bytes: int = 0  # every op's new output, none freed: what saving all of them keeps

    def facts(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "peak_bytes": self.peak_bytes, "flops": self.flops,
                "total_bytes": self.total_bytes}


def available_memory(device: torch.device) -> tuple[int | None, str]:
    """Bytes free where ``device`` allocates, and where that figure came from."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"torch.cuda.mem_get_info({device})"
    if device.type != "cpu":
        return None, f"{device.type}: no free-memory figure"
    free, source = None, "unknown"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free, source = int(line.split()[1]) * 1024, "MemAvailable (/proc/meminfo)"
    except OSError:
        pass
    try:  # a cgroup v2 limit (containers) may be tighter than the machine
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit = f.read().strip()
            if limit != "max":
                left = int(limit) - int(g.read().strip())
                if free is None or left < free:
                    free, source = left, "cgroup memory.max - memory.current"
    except (OSError, ValueError):
        pass
    if free is None and hasattr(os, "sysconf"):
        with contextlib.suppress(ValueError, OSError):
            free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
            source = "sysconf(SC_AVPHYS_PAGES)"
    return free, source


def budget_for(device: torch.device) -> dict[str, Any]:
    """The disclosed bounds of one inference: memory (bytes), FLOPs and seconds."""
    free, source = available_memory(device)
    memory = None if free is None or device.type == "meta" else int(free * MEMORY_FRACTION)
    return {"device": str(device), "memory_bytes": memory, "memory_fraction": MEMORY_FRACTION,
            "memory_available_bytes": free, "memory_source": source,
            "max_flops": MAX_FLOPS.get(device.type), "max_seconds": MAX_SECONDS,
            "check": "FakeTensorMode forward (no allocation) before any real probe"}


def _new_outputs(func: Any, out: Any) -> list[torch.Tensor]:
    """Outputs that own new memory: not views or in-place results (no alias in the schema)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    returns = getattr(getattr(func, "_schema", None), "returns", ())
    fresh = []
    for i, t in enumerate(outs):
        if isinstance(t, torch.Tensor) and not (i < len(returns) and returns[i].alias_info):
            fresh.append(t)
    return fresh


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Meter(TorchDispatchMode):
    """Counts live bytes (freed when an output dies), their peak and FLOPs; raises OverBudget."""

    def __init__(self, memory: int | None, flops: float | None, guard: bool = False):
        super().__init__()
        self.memory, self.max_flops, self.guard = memory, flops, guard
        self.live = self.peak = self.flops = self.total = 0

    def _free(self, n: int) -> None:
        self.live -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.guard and self.memory is not None:
            self._size_on_meta(func, args, kwargs)
        out = func(*args, **kwargs)
        for t in _new_outputs(func, out):
            n = _nbytes(t)
            self.live += n
            self.total += n
            weakref.finalize(t, self._free, n)
        self.peak = max(self.peak, self.live)
        if self.memory is not None and self.peak > self.memory:
            raise OverBudget("memory", self.peak, self.memory, str(func))
        formula = flop_counter.flop_registry.get(func._overloadpacket)
        if formula is not None and not self.guard:
            try:
                self.flops += formula(*args, **kwargs, out_val=out)
            except Exception:  # a formula that cannot read these args counts nothing
                return out
            if self.max_flops is not None and self.flops > self.max_flops:
                raise OverBudget("flops", self.flops, self.max_flops, str(func))
        return out

    def _size_on_meta(self, func, args, kwargs) -> None:
        """Size the op's outputs on meta tensors; refuse before the real kernel allocates."""
        def meta(t):
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

        try:
            out = func(*tree_map_only(torch.Tensor, meta, args),
                       **tree_map_only(torch.Tensor, meta, kwargs))
        except Exception:  # no meta kernel, data-dependent shape: the real op decides
            return
        new = sum(_nbytes(t) for t in _new_outputs(func, out))
        if self.live + new > self.memory:
            raise OverBudget("memory", self.live + new, self.memory, str(func))


# Errors that say fake tensors cannot follow this forward, not that the candidate is wrong.
_FAKE_LIMITS = ("fake", "meta", "tensor subclass", "data-dependent", "data dependent",
                "storage", "data pointer", "_local_scalar_dense", "nonzero", "symbolic", "guard")


def _fake_limit(exc: BaseException) -> bool:
    from torch._subclasses import fake_tensor as ft

    kinds = (ft.DataDependentOutputException, ft.DynamicOutputShapeException,
             ft.UnsupportedFakeTensorException, ft.UnsupportedOperatorException,
             NotImplementedError)
    text = str(exc).lower()
    return isinstance(exc, kinds) or any(s in text for s in _FAKE_LIMITS)


@contextlib.contextmanager
def _quiet_fake_logs() -> Iterator[None]:
    """FakeTensorMode logs every failing meta kernel at ERROR; a failing candidate is expected."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level, log.level = log.level, logging.CRITICAL
    try:
        yield
    finally:
        log.level = level


def precheck(model: nn.Module, shapes: list[tuple[torch.Size, torch.dtype]], positional: int,
             names: list[str], budget: dict[str, Any]) -> Precheck:
    """Run the forward on fake inputs of ``shapes`` over fake parameters and buffers, in eval +
    no-grad with the training flags restored; nothing real is allocated or written. Compiled
    code runs as written (the compiler never sees the fake forward), as in every probe."""
    with warnings.catch_warnings():  # torch warns at this import when numpy is not installed
        warnings.simplefilter("ignore", UserWarning)
        from torch._subclasses.fake_tensor import FakeTensorMode

    device = torch.device(budget["device"])
    flags = [(m, m.training) for m in model.modules()]
    meter = _Meter(budget["memory_bytes"], budget["max_flops"])
    meter.live = sum(shape.numel() * dtype.itemsize for shape, dtype in shapes)
    started = False  # an error before the forward starts is the check's, not the candidate's
    try:
        with _quiet_fake_logs(), torch.random.fork_rng(devices=[]), torch.no_grad(), eager(), \
                FakeTensorMode(allow_non_fake_inputs=True) as fake:
            state = {name: fake.from_tensor(t) for name, t in
                     list(model.named_parameters(remove_duplicate=False))
                     + list(model.named_buffers(remove_duplicate=False))}
            inputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in shapes]
            model.eval()
            with meter:
                started = True
                torch.func.functional_call(model, state, tuple(inputs[:positional]),
                                           dict(zip(names, inputs[positional:])))
    except OverBudget as exc:
        return Precheck("over_budget", meter.peak, meter.flops, exc, meter.total)
    except Exception as exc:
        kind = "inconclusive" if not started or _fake_limit(exc) else "failed"
        return Precheck(kind, meter.peak, meter.flops, exc, meter.total)
    finally:
        for module, flag in flags:
            module.training = flag
    return Precheck("fits", meter.peak, meter.flops, None, meter.total)


@contextlib.contextmanager
def guarded(budget: dict[str, Any]) -> Iterator[_Meter]:
    """A real forward that stops (OverBudget) before an op whose outputs would pass the memory
    bound allocates: for forwards the fake-tensor check could not follow."""
    meter = _Meter(budget["memory_bytes"], None, guard=True)
    with meter:
        yield meter


def check_save_budget(provenance: dict[str, Any], save: Any) -> None:
    """Before rung 3 recaptures with ``save="all"``: refuse when keeping every activation of the
    inferred input would pass the memory budget (the fake check's total of new outputs)."""
    budget = provenance.get("probe_budget") or {}
    rows = [r for r in provenance.get("probe_diary") or () if r.get("outcome") == "verified"]
    need = (rows[-1].get("precheck") or {}).get("total_bytes") if rows else None
    limit = budget.get("memory_bytes")
    if save != "all" or need is None or limit is None or need <= limit:
        return
    from ..errors import InputError

    raise InputError(
        f"saving every activation of the inferred input {rows[-1]['candidate']} would keep about "
        f"{human(need, digits=1)}B, over the {human(limit, digits=1)}B budget "
        f"({budget.get('memory_fraction', 0):.0%} of {budget.get('memory_source')}); nothing "
        "was recaptured",
        code="save_over_budget",
        teach=["tl.trace(model, save=None)  # metadata only: the verified capture itself",
               "tl.trace(model, save=['<label or module>', ...])  # keep a few activations",
               "tl.trace(model, input_shape=(...))  # a smaller input you choose"])
