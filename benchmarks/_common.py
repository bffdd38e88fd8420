"""Shared by ``run.py`` and ``peer_torchlens.py``: the benchmark models, their inputs, timing.

This module must not import ``torchlens``: the peer process imports torchlens 2.36.1 under the
same name, and this file is loaded in both processes.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

MODELS = ("resnet18", "gpt2")
SEQ_LEN = 32
GPT2_CLASSES = ("lm", "base")


def build_model(name: str, *, gpt2_class: str = "lm", n_layer: int | None = None,
                seed: int = 0) -> tuple[torch.nn.Module, Any]:
    """The model (random init, eval mode) and its input.

    The input is a tensor for resnet18 and a mapping of forward keywords ``{"input_ids": ids}`` for
    GPT-2. GPT-2 is built from ``GPT2Config()`` defaults (12 layers, 768 wide) with
    ``use_cache=False`` so that no tool has to pass it as a keyword.
    """
    torch.manual_seed(seed)
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


def time_once(fn: Callable[[], Any]) -> float:
    """Seconds for one call of ``fn``. Garbage from earlier calls is collected first, outside the
    timed region; the result is dropped after the clock stops."""
    gc.collect()
    t0 = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - t0
    del result
    return elapsed


def time_rounds(methods: dict[str, Callable[[], Any]], *, runs: int, warmup: int,
                on_error: Callable[[str, BaseException], None] | None = None
                ) -> dict[str, list[float]]:
    """Time every method ``runs`` times after ``warmup`` untimed calls each.

    The methods are interleaved round by round (plain forward, then each tool, then the next round),
    so slow drift from other load on the machine hits them all alike. A method that raises is
    dropped from later rounds and reported through ``on_error``.
    """
    alive = dict(methods)
    samples: dict[str, list[float]] = {name: [] for name in methods}
    for name, fn in list(alive.items()):
        try:
            for _ in range(warmup):
                time_once(fn)
        except Exception as err:  # one broken tool must not stop the run
            alive.pop(name)
            if on_error:
                on_error(name, err)
    for _ in range(runs):
        for name, fn in list(alive.items()):
            try:
                samples[name].append(time_once(fn))
            except Exception as err:
                alive.pop(name)
                if on_error:
                    on_error(name, err)
    return samples


def summarize(samples: list[float]) -> dict[str, Any]:
    """Median, min and max in milliseconds, and the raw samples."""
    if not samples:
        return {"median_ms": None, "min_ms": None, "max_ms": None, "runs": 0, "samples_ms": []}
    ms = [s * 1e3 for s in samples]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
            "runs": len(ms), "samples_ms": [round(v, 3) for v in ms]}


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
