"""One ``torch.compile`` of a model's forward for one surface call: compiled on the first
forward (timed apart), its graphs and recompiles counted, put away when the call ends so that
nothing compiled stays attached to the model or to torch's caches of the user's code."""

from __future__ import annotations

import time
import types
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import CaptureError, InputError, first_line

TEACH = ["tl.record(model, data, save=[...], compile=True)",
         "tl.record(model, data, save=[...], compile={'backend': 'inductor', "
         "'mode': 'max-autotune'})"]
_KEYS = {"backend", "mode", "dynamic", "options", "fullgraph", "recompile_limit"}


def _forward(model: Any, args: tuple, kwargs: dict) -> Any:
    return model(*args, **kwargs)


def is_compiled(model: Any) -> bool:
    """A module ``torch.compile`` returned (an ``OptimizedModule``)."""
    dynamo = getattr(torch, "_dynamo", None)
    return dynamo is not None and isinstance(model, dynamo.eval_frame.OptimizedModule)


def _backend_of(model: Any) -> Any:
    """The backend the user compiled ``model`` with (a name's compiler object)."""
    backend = model.dynamo_ctx.callback
    while hasattr(backend, "_torchdynamo_orig_backend"):
        backend = backend._torchdynamo_orig_backend
    return backend


def compile_options(compile: Any, model: Any, surface: str) -> dict | None:
    """``compile=`` as torch.compile's keywords, or None for an eager capture: ``True``, a
    mapping of ``backend``/``mode``/``dynamic``/``options``/``fullgraph``/``recompile_limit``,
    or (None) whatever the model was compiled with when it is a compiled module."""
    if compile is None:
        compile = is_compiled(model)
    if compile is False:
        return None
    if compile is True:
        compile = {}
    if not isinstance(compile, Mapping) or not set(compile) <= _KEYS:
        raise InputError(f"compile={compile!r}: pass True, False, or a mapping of "
                         f"{sorted(_KEYS)}", code="option_invalid",
                         teach=[t.replace("tl.record", f"tl.{surface}") for t in TEACH])
    options = dict(compile)
    if is_compiled(model) and "backend" not in options:
        options["backend"] = _backend_of(model)
    return options


class Compiler:
    """``model``'s forward compiled for this call (a code object of its own, whose compiled
    graphs ``close`` drops): ``compile_s`` the first forward's time (compiling included),
    ``graphs`` the graphs compiled, ``recompiles`` those after the first forward's."""

    def __init__(self, options: Mapping[str, Any]):
        options = dict(options)
        self.limit = int(options.pop("recompile_limit", 8))
        backend = options.setdefault("backend", "inductor")
        self.backend = backend if isinstance(backend, str) else getattr(
            backend, "_compiler_name", None) or getattr(backend, "compiler_name", None) or \
            type(backend).__name__
        if self.backend in ("ConvertFrame", "WrapBackendDebug"):
            self.backend = "inductor"
        self.mode = options.get("mode")
        code = _forward.__code__.replace()  # a code object of this call's own
        self.fn = types.FunctionType(code, _forward.__globals__, "torchlens_forward")
        self.compiled = torch.compile(self.fn, **options)
        self.calls = 0
        self.compile_s: float | None = None
        self.graphs = 0
        self.first_graphs = 0
        self.breaks = 0

    @property
    def recompiles(self) -> int:
        return self.graphs - self.first_graphs

    def __call__(self, model: Any, args: tuple, kwargs: dict) -> Any:
        from torch._dynamo.utils import counters

        graphs = counters["stats"]["unique_graphs"]
        breaks = sum(counters["graph_break"].values())
        t0 = time.perf_counter()
        exc_types = torch._dynamo.exc
        try:
            # an int a module counts with (``self.calls += 1``) is an input, not a constant
            # that recompiles the forward each call
            with torch._dynamo.config.patch(recompile_limit=self.limit,
                                            fail_on_recompile_limit_hit=True,
                                            allow_unspec_int_on_nn_module=True):
                out = self.compiled(model, args, kwargs)
        except exc_types.FailOnRecompileLimitHit as exc:
            raise CaptureError(
                f"compile=: the forward recompiled {self.limit} times (graphs: {self.graphs}); "
                "its input shapes or Python arguments keep changing",
                code="compile_recompile_limit",
                teach=["pad inputs to a few lengths, or raise the limit: tl.record(model, data, "
                       "save=[...], compile={'recompile_limit': 16})",
                       "tl.record(model, data, save=[...], compile=False)"]) from exc
        except exc_types.TorchDynamoException as exc:
            raise CaptureError(f"compile=: torch.compile failed on the forward with its taps: "
                               f"{first_line(exc)}", code="compile_failed",
                               teach=["tl.record(model, data, save=[...], compile=False)",
                                      "tl.record(model, data, save=[...], "
                                      "compile={'backend': 'eager'})"]) from exc
        self.graphs += counters["stats"]["unique_graphs"] - graphs
        self.breaks += sum(counters["graph_break"].values()) - breaks
        if self.calls == 0:
            self.compile_s = time.perf_counter() - t0
            self.first_graphs = self.graphs
        self.calls += 1
        return out

    def describe(self) -> dict[str, Any]:
        """What a store's manifest and a trace's meta say of the compiling."""
        return {"backend": self.backend, "mode": self.mode, "graphs": self.graphs,
                "recompiles": self.recompiles, "graph_breaks": self.breaks,
                "first_forward_s": None if self.compile_s is None else round(self.compile_s, 3)}

    def close(self) -> None:
        """Drop this call's compiled graphs (torch keeps them on the code object)."""
        reset = getattr(torch._C._dynamo.eval_frame, "reset_code", None)
        if reset is not None:
            reset(self.fn.__code__)
        self.compiled = None
