"""What gradients cost: ``tl.trace(save=None, save_grads=...)`` + ``trace.backward`` against a
plain forward + ``torch.autograd.grad`` over the same tensors; and attribution patching against
the exact patching sweep.

Run ``hatch run bench:grads`` (``--runs 10``). Models: torchvision resnet18 (1x3x224x224) and
GPT-2 (``GPT2Config()``: 12 layers, 768 wide, 32 tokens), random weights, eval, one thread,
timed in one process by ``_common.time_rounds``. Target: the sum of one output logit row.

- every site: TorchLens ``save_grads="all"`` against a hand-written ``TorchFunctionMode`` that
  keeps every torch call's output tensor during a plain forward, then one ``torch.autograd.grad``
  over all of them (what ``retain_grad`` on each would give);
- one site (resnet18 ``layer3``, GPT-2 ``transformer.h.6``): against a forward hook that keeps
  that module's output, then ``torch.autograd.grad`` over it.

Attribution patching: GPT-2 12 layers, 16 tokens, the 12 block outputs x 16 positions:
``tl.attribution.patching`` against ``tl.patching.sweep(batch_size=1)`` (timed once each), and
the correlation of their 192 cells. Targets (issue 46): every site <= 1.5x, one site <= 1.15x;
attribution patching >= 20x faster than the sweep. Results: ``benchmarks/results/grads.json``
and ``.txt``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, os.path.dirname(__file__))
from _common import build_model, call, machine, save_results, summarize, time_rounds  # noqa: E402

import torchlens as tl  # noqa: E402

SITE = {"resnet18": "layer3", "gpt2": "transformer.h.6"}


def target(name: str, out: Any) -> torch.Tensor:
    return out[0].sum() if name == "resnet18" else out.logits[0, -1].sum()


class KeepAll(TorchFunctionMode):
    """Keeps every tensor a torch call returns that needs a gradient."""

    def __init__(self):
        super().__init__()
        self.kept: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.requires_grad:
            self.kept.append(out)
        return out


def by_hand_all(model, x, name):
    def run():
        with KeepAll() as mode:
            out = call(model, x)
        return torch.autograd.grad(target(name, out), mode.kept, allow_unused=True)
    return run


def by_hand_one(model, x, name):
    module = model.get_submodule(SITE[name])

    def run():
        kept = []
        handle = module.register_forward_hook(
            lambda m, a, o: kept.append(o[0] if isinstance(o, tuple) else o))
        try:
            out = call(model, x)
        finally:
            handle.remove()
        return torch.autograd.grad(target(name, out), kept)
    return run


def traced(model, x, name, sites):
    def run():
        trace = tl.trace(model, x, save=None, save_grads=sites)
        trace.backward(lambda out: target(name, out))
        return trace
    return run


def attribution(runs_sweep: bool) -> tuple[dict[str, Any], str]:
    model, _ = build_model("gpt2")
    torch.manual_seed(0)
    clean = torch.randint(0, 50257, (1, 16))
    corrupt = clean.clone()
    corrupt[0, 5] = (clean[0, 5] + 101) % 50257
    metric = lambda out: out.logits[0, -1, 42] - out.logits[0, -1, 7]  # noqa: E731
    start = time.perf_counter()
    est = tl.attribution.patching(model, clean, corrupt, metric, sites=["transformer.h.*"])
    est_s = time.perf_counter() - start
    row: dict[str, Any] = {"attribution_s": est_s, "cells": est.values.numel()}
    line = f"attribution patching, gpt2 12 layers, 12 sites x 16 positions: {est_s:.2f} s"
    if runs_sweep:
        start = time.perf_counter()
        exact = tl.patching.sweep(model, clean, corrupt, sites=["transformer.h.*"],
                                  metric=metric, batch_size=1)
        sweep_s = time.perf_counter() - start
        corr = float(torch.corrcoef(torch.stack([est.values.flatten(),
                                                 exact.values.flatten()]))[0, 1])
        row.update(sweep_s=sweep_s, speedup=sweep_s / est_s, correlation=corr)
        line += (f" vs the exact sweep (batch_size=1) {sweep_s:.1f} s = {sweep_s / est_s:.0f}x "
                 f"faster (target >= 20x: {'PASS' if sweep_s / est_s >= 20 else 'MISS'}); "
                 f"correlation of the 192 normalised cells {corr:.3f}")
    return row, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--models", nargs="*", default=["resnet18", "gpt2"])
    parser.add_argument("--no-sweep", action="store_true", help="skip the exact sweep (slow)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    report: dict[str, Any] = {"machine": machine(), "runs": args.runs, "models": {}}
    lines = []
    for name in args.models:
        model, x = build_model(name)
        methods = {"by hand, every tensor": by_hand_all(model, x, name),
                   "tl, every site": traced(model, x, name, "all"),
                   "by hand, one module": by_hand_one(model, x, name),
                   "tl, one site": traced(model, x, name, [SITE[name]])}
        samples = time_rounds(methods, runs=args.runs, warmup=1)
        stats = {k: summarize(v) for k, v in samples.items()}
        med = {k: v["median_ms"] for k, v in stats.items()}
        all_ratio = med["tl, every site"] / med["by hand, every tensor"]
        one_ratio = med["tl, one site"] / med["by hand, one module"]
        report["models"][name] = {"median_ms": med, "all_ratio": all_ratio,
                                  "one_ratio": one_ratio, "stats": stats}
        lines.append(f"{name:9s} every site: {med['tl, every site']:8.1f} ms vs by hand "
                     f"{med['by hand, every tensor']:8.1f} ms = {all_ratio:.2f}x (target <= "
                     f"1.5x: {'PASS' if all_ratio <= 1.5 else 'MISS'})")
        lines.append(f"{name:9s} one site ({SITE[name]}): {med['tl, one site']:8.1f} ms vs by "
                     f"hand {med['by hand, one module']:8.1f} ms = {one_ratio:.2f}x (target <= "
                     f"1.15x: {'PASS' if one_ratio <= 1.15 else 'MISS'})")
        print("\n".join(lines[-2:]), flush=True)
        del model, x, methods
    report["attribution_patching"], line = attribution(not args.no_sweep)
    lines.append(line)
    print(line, flush=True)
    save_results("grads", report, lines)


if __name__ == "__main__":
    main()
