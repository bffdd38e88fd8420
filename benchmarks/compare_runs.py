"""What comparing two runs costs: ``tl.compare`` of two GPT-2 traces with every value saved,
against one capture of that model; and two Llama-3-70B meta traces (structure only).

Run ``hatch run bench:compare`` (``--runs 20``). GPT-2: ``GPT2Config()`` (12 layers, 768 wide,
32 tokens), random weights, eval, ``torch.no_grad()``, one thread. The two traces are two
``tl.trace(model, x, save="all")`` of the same model, the second with a module edit in block 6
(so half the values differ); the compare is ``tl.compare(a, b)`` (match, the four numbers per
op) plus ``cmp.first_divergence()`` and ``str(cmp)`` (the table), all timed together against
one ``tl.trace(model, x, save="all")``, in one process by ``_common.time_rounds``.

Llama-3-70B: the config of ``meta_models.py`` built on the meta device, traced with
``save=None`` at 16 and at 32 tokens (every shape differs, the labels do not) and, for a graph
that differs, against the same config with 79 layers (a block's ops are on one side only);
each compare timed once (it is seconds, not milliseconds), with ``first_divergence`` and the
table. Targets (issue 48): GPT-2 compare <= 0.5x one capture; 70B compares <= 3 s. Results go to
``benchmarks/results/compare.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import build_model, machine, save_results, summarize, time_rounds  # noqa: E402

import torchlens as tl  # noqa: E402


def _compare(a: Any, b: Any) -> tuple[Any, str]:
    cmp = tl.compare(a, b)
    cmp.first_divergence()
    return cmp, str(cmp)


def gpt2(runs: int) -> tuple[dict[str, Any], str]:
    model, x = build_model("gpt2")
    with torch.no_grad():
        a = tl.trace(model, x, save="all")
        b = tl.trace(model, x, save="all",
                     edits={"transformer.h.6": tl.edits.scale(1.01)})

    def capture() -> Any:
        with torch.no_grad():
            return tl.trace(model, x, save="all")

    samples = time_rounds({"capture save=all": capture, "compare": lambda: _compare(a, b)},
                          runs=runs, warmup=2)
    stats = {k: summarize(v) for k, v in samples.items()}
    cap, cmp = stats["capture save=all"]["median_ms"], stats["compare"]["median_ms"]
    compared = tl.compare(a, b)
    row = {"ops": len(a.ops), "capture_ms": cap, "compare_ms": cmp, "ratio": cmp / cap,
           "differ": len(compared.differing()),
           "first_divergence": compared.first_divergence().label}
    line = (f"gpt2 (12 layers, 32 tokens, {len(a.ops)} ops, every value saved): compare "
            f"{cmp:.1f} ms vs one capture {cap:.1f} ms = {cmp / cap:.2f}x (target <= 0.5x: "
            f"{'PASS' if cmp / cap <= 0.5 else 'MISS'}); {row['differ']} ops differ, first at "
            f"{row['first_divergence']}")
    return {"summary": row, "stats": stats}, line


def llama(layers: int | None = None) -> torch.nn.Module:
    import transformers
    from meta_models import config

    cls_name, cfg = config("llama-3-70b")
    if layers is not None:
        cfg.num_hidden_layers = layers
    with torch.device("meta"):
        return getattr(transformers, cls_name)(cfg).to(torch.bfloat16).eval()


def llama70b() -> tuple[dict[str, Any], list[str]]:
    model = llama()
    t16 = tl.trace(model, input_shape=(1, 16), save=None)
    t32 = tl.trace(model, input_shape=(1, 32), save=None)
    del model
    short = tl.trace(llama(79), input_shape=(1, 16), save=None)
    out, lines = {}, []
    for name, (a, b) in {"same graph, 16 vs 32 tokens": (t16, t32),
                         "80 vs 79 layers": (t16, short)}.items():
        start = time.perf_counter()
        cmp, _ = _compare(a, b)
        seconds = time.perf_counter() - start
        counts = {s: sum(r.status == s for r in cmp.rows) for s in ("matched", "changed",
                                                                    "added", "removed")}
        out[name] = {"seconds": seconds, "ops": [len(a.ops), len(b.ops)], **counts}
        lines.append(f"llama-3-70b meta, {name}: {len(a.ops)} vs {len(b.ops)} ops compared in "
                     f"{seconds:.2f} s (target <= 3 s: {'PASS' if seconds <= 3 else 'MISS'}); "
                     + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return out, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--skip-70b", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    report: dict[str, Any] = {"machine": machine(), "runs": args.runs}
    report["gpt2"], line = gpt2(args.runs)
    lines = [line]
    print(line, flush=True)
    if not args.skip_70b:
        report["llama-3-70b"], more = llama70b()
        lines += more
        print("\n".join(more), flush=True)
    save_results("compare", report, lines)


if __name__ == "__main__":
    main()
