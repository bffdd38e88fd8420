"""Shared by ``run.py`` and ``peer_torchlens.py``: the benchmark models, their inputs, timing.

This module must not import ``torchlens``: the peer process imports torchlens 2.36.1 under the
same name, and this file is loaded in both processes.
"""

from __future__ import annotations

import gc
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

MODELS = ("tinyops", "resnet18", "gpt2")
SEQ_LEN = 32
GPT2_CLASSES = ("lm", "base")
TINY_LAYERS = 300


class TinyOps(torch.nn.Module):
    """A dispatch-bound stand-in for a launch-bound GPU forward: 300 x (Linear(8, 8), relu, + 1)."""

    def __init__(self, n: int = TINY_LAYERS) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x)) + 1
        return x


class BareMode(TorchFunctionMode):
    """The floor of a Python-level capture: calls the function and appends a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls.append((func, types))
        return out


def build_model(name: str, *, gpt2_class: str = "lm", n_layer: int | None = None,
                seed: int = 0) -> tuple[torch.nn.Module, Any]:
    """The model (random init, eval mode) and its input.

    The input is a tensor for tinyops (1x8) and resnet18, and a mapping of forward keywords
    ``{"input_ids": ids}`` for GPT-2. GPT-2 is built from ``GPT2Config()`` defaults (12 layers,
    768 wide) with ``use_cache=False`` so that no tool has to pass it as a keyword.
    """
    torch.manual_seed(seed)
    if name == "tinyops":
        return TinyOps().eval(), torch.randn(1, 8)
    if name == "resnet18":
        import torchvision

        model = torchvision.models.resnet18(weights=None).eval()
        return model, torch.randn(1, 3, 224, 224)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

        config = GPT2Config(use_cache=False)
        if n_layer is not None:
            config.n_layer = n_layer
        cls = GPT2LMHeadModel if gpt2_class == "lm" else GPT2Model
        model = cls(config).eval()
        ids = torch.randint(0, config.vocab_size, (1, SEQ_LEN))
        return model, {"input_ids": ids}
    raise ValueError(f"unknown model {name!r}")


def call(model: torch.nn.Module, x: Any) -> Any:
    """A plain forward on the benchmark input (a tensor or a mapping of forward keywords)."""
    if isinstance(x, dict):
        return model(**x)
    return model(x)


def plain_forward(model: torch.nn.Module, x: Any) -> Callable[[], Any]:
    def run() -> Any:
        with torch.no_grad():
            return call(model, x)

    return run


def bare_forward(model: torch.nn.Module, x: Any) -> Callable[[], Any]:
    """The plain forward under a fresh ``BareMode``, as a user would wrap it."""

    def run() -> Any:
        with torch.no_grad(), BareMode():
            return call(model, x)

    return run


def bare_calls(model: torch.nn.Module, x: Any) -> int:
    """How many torch functions ``BareMode`` sees in one forward."""
    with torch.no_grad(), BareMode() as mode:
        call(model, x)
    return len(mode.calls)


class GcClock:
    """Time the cyclic garbage collector runs, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self.full = 0
        self._t0: float | None = None

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            self.seconds += time.perf_counter() - self._t0
            self.collections += 1
            self.full += info.get("generation") == 2
            self._t0 = None

    def __enter__(self) -> GcClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        gc.callbacks.remove(self)


def time_once(fn: Callable[[], Any]) -> float:
    """Seconds for one call of ``fn`` and dropping what it returned, with no ``gc.collect()``
    around it: freeing the result and the collections its garbage triggers are paid in the loop,
    as in a user's loop."""
    t0 = time.perf_counter()
    result = fn()
    del result
    return time.perf_counter() - t0


def time_rounds(methods: dict[str, Callable[[], Any]], *, runs: int, warmup: int, block: int = 5,
                on_error: Callable[[str, BaseException], None] | None = None,
                gc_out: dict[str, dict[str, Any]] | None = None) -> dict[str, list[float]]:
    """Time every method ``runs`` times after ``warmup`` untimed calls each, in blocks.

    Each round gives every method one block of ``block`` back-to-back calls, as a user's loop
    makes them: the collections its own garbage triggers land in its own calls. Before a block
    one ``gc.collect()`` and one untimed call run, so no method pays for another's garbage (that
    can only favour a method whose reference cycles would later force full collections, never
    TorchLens, which leaves none). The order of the methods rotates each round, so drift and
    order effects hit them all alike. ``gc_out`` (if given) receives, per method, the
    collector's seconds in each timed call, its count of collections (all / full), and the
    process's minor page faults and kernel seconds over the timed calls (``getrusage``, read
    outside the timed region). A method that raises is dropped and reported through
    ``on_error``.
    """
    alive = dict(methods)
    samples: dict[str, list[float]] = {name: [] for name in methods}
    gc_runs = {name: {"seconds": [], "collections": 0, "full": 0, "faults": 0, "sys_s": 0.0}
               for name in methods}

    def drop(name: str, err: BaseException) -> None:
        alive.pop(name, None)
        samples[name] = []
        if on_error:
            on_error(name, err)

    for name, fn in list(alive.items()):
        try:
            for _ in range(warmup):
                time_once(fn)
        except Exception as err:  # one broken tool must not stop the run
            drop(name, err)
    rounds = -(-runs // block)
    with GcClock() as clock:
        for r in range(rounds):
            names = list(alive)
            for name in names[r % len(names):] + names[:r % len(names)] if names else []:
                fn = alive[name]
                gc.collect()
                try:
                    time_once(fn)
                    for _ in range(min(block, runs - r * block)):
                        before = (clock.seconds, clock.collections, clock.full)
                        usage = resource.getrusage(resource.RUSAGE_SELF)
                        samples[name].append(time_once(fn))
                        after = resource.getrusage(resource.RUSAGE_SELF)
                        g = gc_runs[name]
                        g["seconds"].append(clock.seconds - before[0])
                        g["collections"] += clock.collections - before[1]
                        g["full"] += clock.full - before[2]
                        g["faults"] += after.ru_minflt - usage.ru_minflt
                        g["sys_s"] += after.ru_stime - usage.ru_stime
                except Exception as err:
                    drop(name, err)
    if gc_out is not None:
        gc_out.update(gc_runs)
    return samples


def summarize(samples: list[float], gc_run: dict[str, Any] | None = None) -> dict[str, Any]:
    """Mean (all back-to-back calls' total / runs, collector pauses included), median, min and
    max in milliseconds, the raw samples, and the collector's share when ``gc_run`` is given."""
    if not samples:
        return {"mean_ms": None, "median_ms": None, "min_ms": None, "max_ms": None, "runs": 0,
                "samples_ms": []}
    ms = [s * 1e3 for s in samples]
    out = {"mean_ms": statistics.fmean(ms), "median_ms": statistics.median(ms), "min_ms": min(ms),
           "max_ms": max(ms), "runs": len(ms), "samples_ms": [round(v, 3) for v in ms]}
    if gc_run and gc_run.get("seconds"):
        out["gc_mean_ms"] = statistics.fmean(gc_run["seconds"]) * 1e3
        out["gc_collections"] = gc_run["collections"]
        out["gc_full_collections"] = gc_run["full"]
        out["faults_per_call"] = gc_run["faults"] / len(ms)
        out["sys_ms_per_call"] = gc_run["sys_s"] * 1e3 / len(ms)
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def machine() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def write_results(json_path: str, res: dict[str, Any], text: str) -> None:
    """Every figure to ``json_path``, the markdown table beside it (``.md``), and to stdout."""
    import json
    from pathlib import Path

    Path(json_path).write_text(json.dumps(res, indent=1))
    Path(json_path).with_suffix(".md").write_text(text)
    print(text)


def save_results(name: str, report: dict[str, Any], lines: list[str]) -> None:
    """``results/<name>.json`` (every figure) and ``results/<name>.txt`` (the printed lines)."""
    import json

    folder = os.path.join(os.path.dirname(__file__), "results")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{name}.json"), "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=1)
    with open(os.path.join(folder, f"{name}.txt"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
