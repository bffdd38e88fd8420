"""Models that don't fit: Llama-3-70B and Mixtral-8x7B configs built on the meta device.

Each model runs in a fresh process (``hatch run bench:meta``): build on meta, ``tl.summary``,
then ``tl.draw(collapse="auto")`` to SVG, timing each and reading the process's peak RSS. No
weights exist anywhere; shapes, parameter counts, FLOPs and bytes come from the config.
Results: ``results/meta_models.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import write_results

HERE = Path(__file__).resolve().parent
TARGETS = {"summary_s": 5.0, "draw_s": 10.0, "peak_rss_gb": 1.5}


def config(name: str):
    from transformers import LlamaConfig, MixtralConfig

    if name == "llama-3-70b":
        return "LlamaForCausalLM", LlamaConfig(
            hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
            num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
            max_position_embeddings=8192, rope_theta=500000.0, dtype="bfloat16")
    return "MixtralForCausalLM", MixtralConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
        max_position_embeddings=32768, rope_theta=1e6, dtype="bfloat16")


def child(name: str, tokens: int) -> None:
    """One model in this fresh process; prints one JSON line."""
    import torch
    import transformers

    import torchlens as tl

    cls_name, cfg = config(name)
    start = time.perf_counter()
    with torch.device("meta"):
        model = getattr(transformers, cls_name)(cfg).to(torch.bfloat16).eval()
    out = {"model": name, "class": cls_name, "build_s": time.perf_counter() - start,
           "parameters": sum(p.numel() for p in model.parameters())}
    try:
        start = time.perf_counter()
        summary = tl.summary(model, input_shape=(1, tokens))
        out["summary_s"] = time.perf_counter() - start
        out["ops"] = summary.totals["ops"]
        out["flops"] = summary.totals["flops"]
        out["summary_params"] = summary.totals["total_params"]
        out["receipt"] = summary.receipt.scope
        path = Path(tempfile.mkdtemp()) / f"{name}.svg"
        start = time.perf_counter()
        drawing = tl.draw(model, input_shape=(1, tokens), path=path)
        out["draw_s"] = time.perf_counter() - start
        out["draw_nodes"] = drawing.stats.get("nodes") if drawing.stats else None
        out["folded"] = sorted(set(re.findall(r"\w+Layer ×\d+", path.read_text())))
    except tl.TorchLensError as err:
        out["refused"] = err.code
        out["refused_after_s"] = time.perf_counter() - start
        out["message"] = err.message[:300]
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(json.dumps(out))


def markdown(res: dict) -> str:
    lines = ["# Models that don't fit: configs on the meta device", "",
             f"Machine: {res['machine']}; input_shape=(1, {res['tokens']}); each model in a "
             "fresh process; bf16 configs.", "",
             "| model | params | ops | FLOPs | summary | draw (collapse=auto) | peak RSS | "
             "verdict |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["runs"]:
        if "refused" in r:
            lines.append(f"| {r['model']} | {r['parameters'] / 1e9:.1f}B | - | - | refused "
                         f"`{r['refused']}` after {r['refused_after_s']:.2f} s | - | "
                         f"{r['peak_rss_gb']:.2f} GB | refusal |")
            continue
        ok = (r["summary_s"] <= TARGETS["summary_s"] and r["draw_s"] <= TARGETS["draw_s"]
              and r["peak_rss_gb"] <= TARGETS["peak_rss_gb"])
        lines.append(f"| {r['model']} | {r['parameters'] / 1e9:.1f}B | {r['ops']:,} | "
                     f"{r['flops'] / 1e12:.2f}T | {r['summary_s']:.2f} s | {r['draw_s']:.2f} s "
                     f"({', '.join(r['folded']) or 'no fold'}) | {r['peak_rss_gb']:.2f} GB | "
                     f"{'PASS' if ok else 'MISS'} |")
    lines += ["", f"Targets: tl.summary ≤ {TARGETS['summary_s']:.0f} s, tl.draw ≤ "
              f"{TARGETS['draw_s']:.0f} s, peak RSS ≤ {TARGETS['peak_rss_gb']} GB."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama-3-70b,mixtral-8x7b")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--json", default=str(HERE / "results" / "meta_models.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.tokens)
    env = {**os.environ, "TRANSFORMERS_VERBOSITY": "error"}
    runs = []
    for name in args.models.split(","):
        done = subprocess.run([sys.executable, __file__, "--child", name, "--tokens",
                               str(args.tokens)], capture_output=True, text=True, env=env)
        if done.returncode:
            raise SystemExit(done.stderr[-3000:])
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    import torch

    res = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
           "tokens": args.tokens, "runs": runs}
    write_results(args.json, res, markdown(res))


if __name__ == "__main__":
    main()
