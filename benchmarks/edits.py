"""What an edit costs: an edited ``tl.trace(save=None)`` against the same capture unedited, and
against the plain forward with a hand-written ``register_forward_hook`` doing the same edit.

Run ``hatch run bench:edits`` (``--runs 30``). Models: torchvision resnet18 (1x3x224x224) and
GPT-2 (``GPT2Config()``: 12 layers, 768 wide, 32 tokens), random weights, eval, under
``torch.no_grad()``, all methods timed in one process by ``_common.time_rounds`` (rotating
order, a ``gc.collect()`` before each block). Two edits per model:

- a module site (resnet18 ``layer2.0``, GPT-2 ``transformer.h.6``): a steering vector added;
- an op site no module boundary exposes (resnet18: the in-place ReLU's second call in
  ``layer1.0``, one channel zeroed; GPT-2: the first residual ``add`` of ``transformer.h.6``,
  one position zeroed). An op site makes the capture number every op during the forward.

Targets (issue 45): an edited capture costs at most 1.10x the same capture unedited; on GPT-2,
``trace.push`` of the module edit (from the middle: block 6 of 12) costs less than a re-run that
gives the same product (``tl.trace(save="all", edits=...)``). Results go to
``benchmarks/results/edits.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import build_model, call, machine, save_results, summarize, time_rounds  # noqa: E402

import torchlens as tl  # noqa: E402


def sites(model: torch.nn.Module, x: Any, name: str) -> dict[str, tuple[str, Any, Any]]:
    """Per edit: (site, tl.edits value, the same edit as a forward hook on a module)."""
    torch.manual_seed(1)
    if name == "resnet18":
        steer = torch.randn(28)

        def zero_channel(module, args, out):
            out = out.clone()
            out[:, 5] = 0
            return out
        return {"module": ("layer2.0", tl.edits.add(steer), (model.layer2[0],
                                                             lambda m, a, o: o + steer)),
                "op": ("layer1.0.relu:2", tl.edits.zero(index=(slice(None), 5)),
                       (model.layer1[0], zero_channel))}
    steer = torch.randn(768)
    trace = tl.trace(model, x, save=None)
    add = next(op.label for op in trace if op.func == "add" and op.module == "transformer.h.6")

    def zero_position(module, args, out):
        first = out[0].clone()  # GPT2Attention returns (output, weights)
        first[:, 4] = 0
        return (first, *out[1:])
    return {"module": ("transformer.h.6", tl.edits.add(steer),
                       (model.transformer.h[6], lambda m, a, o: o + steer)),
            # (the hook edits the attention's output, which that add reads: the same change)
            "op": (add, tl.edits.zero(index=(slice(None), 4)),
                   (model.transformer.h[6].attn, zero_position))}


def hooked(model: torch.nn.Module, x: Any, module: torch.nn.Module, hook: Any):
    def run() -> Any:
        handle = module.register_forward_hook(hook)
        try:
            with torch.no_grad():
                return call(model, x)
        finally:
            handle.remove()
    return run


def traced(model: torch.nn.Module, x: Any, edits: dict | None):
    def run() -> Any:
        with torch.no_grad():
            return tl.trace(model, x, save=None, edits=edits)
    return run


def _all(model: torch.nn.Module, x: Any, edits: dict) -> Any:
    with torch.no_grad():
        return tl.trace(model, x, save="all", edits=edits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--models", nargs="*", default=["resnet18", "gpt2"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    report: dict[str, Any] = {"machine": machine(), "runs": args.runs, "models": {}}
    lines = []
    for name in args.models:
        model, x = build_model(name)
        methods = {"trace": traced(model, x, None)}
        for kind, (site, edit, (module, hook)) in sites(model, x, name).items():
            methods[f"trace+{kind} edit"] = traced(model, x, {site: edit})
            methods[f"hook {kind} edit"] = hooked(model, x, module, hook)
        if name == "gpt2":
            site, edit, _ = sites(model, x, name)["module"]
            with torch.no_grad():
                clean = tl.trace(model, x, save="all", intervention_ready=True)
            methods["push module edit"] = lambda clean=clean, e={site: edit}: clean.push(e)
            methods["rerun save=all module edit"] = lambda m=model, v=x, e={site: edit}: _all(
                m, v, e)
        samples = time_rounds(methods, runs=args.runs, warmup=2)
        stats = {k: summarize(v) for k, v in samples.items()}
        base = stats["trace"]["median_ms"]
        row = {"trace_ms": base}
        for kind in ("module", "op"):
            edited = stats[f"trace+{kind} edit"]["median_ms"]
            row[f"{kind}_edit_ms"] = edited
            row[f"{kind}_edit_ratio"] = edited / base
            row[f"{kind}_hook_ms"] = stats[f"hook {kind} edit"]["median_ms"]
            verdict = "PASS" if edited / base <= 1.10 else "MISS"
            lines.append(f"{name:9s} {kind:6s} edit: {edited:8.2f} ms vs unedited {base:8.2f} ms "
                         f"= {edited / base:.3f}x (target <= 1.10x: {verdict}); plain forward "
                         f"with a hook {row[f'{kind}_hook_ms']:.2f} ms")
        if name == "gpt2":
            push, rerun = (stats[k]["median_ms"] for k in ("push module edit",
                                                           "rerun save=all module edit"))
            row.update(push_ms=push, rerun_all_ms=rerun)
            lines.append(f"{name:9s} push from block 6: {push:8.2f} ms vs a save='all' re-run "
                         f"{rerun:8.2f} ms = {push / rerun:.3f}x (target < 1: "
                         f"{'PASS' if push < rerun else 'MISS'})")
        report["models"][name] = {"summary": row, "stats": stats}
        print("\n".join(lines[-3 if name == "gpt2" else -2:]), flush=True)
        del model, x, methods
    save_results("edits", report, lines)


if __name__ == "__main__":
    main()
