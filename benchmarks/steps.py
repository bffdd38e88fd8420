"""What a generation run costs: ``tl.generate`` against the model's own ``generate``.

Run ``hatch run bench:steps`` (``--runs 5``). GPT-2 (``GPT2Config()``: 12 layers, 768 wide,
random weights, eval, one thread, a KV cache), a 16-token prompt, 32 new tokens, greedy, every
method timed in one process by ``_common.time_rounds``:

- plain ``lm.generate``;
- plain ``lm.generate`` under a TorchFunctionMode that only passes calls through: the floor of
  a recorder of this kind;
- ``tl.generate(save=None)``: every step captured (its graph and costs);
- ``tl.generate(save=<4 residual sites>)``: ``transformer.h.{0,4,8,11}`` saved on every step;
- ``tl.generate(save=[...], at_steps=[0])``: only the prefill captured;
- ``tl.generate(save="all")``: every activation of every step (what the peer below keeps).

``--peer``: torchlens 2.36.1's episode capture of the same generation, in its own process and
env (``bench-peer``, made by ``hatch`` when missing; ``peer_steps.py``), against its own plain
``lm.generate``: one sample, since it takes minutes.

Memory: ``tl.generate(save=None)`` for 32 and for 256 new tokens, each in a fresh process,
peak RSS (``ru_maxrss``) against the same process's plain ``lm.generate`` of that length: the
growth a long run adds over a short one. Targets (issue 47): save=None <= 1.3x, four sites
<= 1.5x, at_steps=[0] <= 1.1x, each by the ratio of medians and by the median of the per-round
ratios (paired: each round runs every method back to back, so the machine's drift between
rounds cancels); 256 steps within 10% of 32. Results:
``benchmarks/results/steps.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, os.path.dirname(__file__))
from _common import build_model, machine, save_results, summarize, time_rounds  # noqa: E402

import torchlens as tl  # noqa: E402

SITES = [f"transformer.h.{i}" for i in (0, 4, 8, 11)]


def setup(new_tokens: int) -> tuple[Any, torch.Tensor, dict]:
    model, _ = build_model("gpt2")
    model.generation_config.eos_token_id = None
    model.generation_config.use_cache = model.config.use_cache = True
    ids = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(0))
    options = {"max_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
    return model, ids, options


def memory_child(new_tokens: int) -> None:
    """One fresh process: peak RSS after a plain generate, then after tl.generate."""
    torch.set_num_threads(1)
    model, ids, options = setup(new_tokens)
    with torch.no_grad():
        model.generate(ids, **options)
    plain = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run = tl.generate(model, ids, save=None, **{k: v for k, v in options.items()})
    traced = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"new_tokens": new_tokens, "plain_kb": plain, "traced_kb": traced,
                      "steps": len(run), "structures": run.structures}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--peer", action="store_true", help="also time torchlens 2.36.1")
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        return memory_child(args.memory_child)
    torch.set_num_threads(1)
    model, ids, options = setup(32)

    def plain():
        with torch.no_grad():
            return model.generate(ids, **options)

    class PassThrough(TorchFunctionMode):
        """What any TorchFunctionMode recorder pays before it records anything."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def floor():
        with torch.no_grad(), PassThrough():
            return model.generate(ids, **options)

    def traced(**kw):
        return lambda: tl.generate(model, ids, **kw, **options)

    assert tl.generate(model, ids, **options).tokens == plain()[0, 16:].tolist()
    methods = {"plain generate": plain, "pass-through mode": floor,
               "tl save=None": traced(save=None), "tl 4 sites": traced(save=SITES),
               "tl at_steps=[0]": traced(save=SITES, at_steps=[0]),
               "tl save='all'": traced(save="all")}
    samples = time_rounds(methods, runs=args.runs, warmup=1, block=1)
    stats = {k: summarize(v) for k, v in samples.items()}
    med = {k: v["median_ms"] for k, v in stats.items()}
    base = med["plain generate"]
    # each round times every method once, back to back: the median of the per-round ratios
    # cancels the machine's drift across rounds, which the ratio of medians keeps
    paired = {k: statistics.median(a / b for a, b in zip(v, samples["plain generate"]))
              for k, v in samples.items() if v}
    lines = [f"gpt2 12 layers, 16-token prompt, 32 new tokens greedy: plain generate "
             f"{base:.0f} ms; ratios by medians, then paired (the median of the "
             f"{args.runs} per-round ratios); a target passes when both are within it"]
    for name, target in (("tl save=None", 1.3), ("tl 4 sites", 1.5), ("tl at_steps=[0]", 1.1)):
        ratio = med[name] / base
        ok = max(ratio, paired[name]) <= target
        lines.append(f"  {name:16s} {med[name]:8.0f} ms = {ratio:.2f}x, paired "
                     f"{paired[name]:.3f}x (target <= {target}x: {'PASS' if ok else 'MISS'})")
    lines.append(f"  {'pass-through mode':16s} {med['pass-through mode']:8.0f} ms = "
                 f"{med['pass-through mode'] / base:.2f}x, paired "
                 f"{paired['pass-through mode']:.3f}x (a TorchFunctionMode that records "
                 "nothing: the floor of any recorder of this kind)")
    every = med["tl save='all'"]
    every_paired = paired["tl save='all'"]
    lines.append(f"  {'tl save=all':16s} {every:8.0f} ms = {every / base:.2f}x, paired "
                 f"{every_paired:.3f}x (every activation of every step)")
    print("\n".join(lines), flush=True)
    memory = {}
    for n in (32, 256):
        out = subprocess.run([sys.executable, __file__, "--memory-child", str(n)],
                             capture_output=True, text=True, check=True)
        memory[n] = json.loads(out.stdout.strip().splitlines()[-1])
    grow = {n: memory[n]["traced_kb"] - memory[n]["plain_kb"] for n in memory}
    ratio = memory[256]["traced_kb"] / memory[32]["traced_kb"]
    lines.append(f"  memory, save=None: peak RSS {memory[32]['traced_kb'] / 1024:.0f} MiB at 32 "
                 f"steps, {memory[256]['traced_kb'] / 1024:.0f} MiB at 256 = {ratio:.3f}x "
                 f"(target within 10%: {'PASS' if ratio <= 1.10 else 'MISS'}); over plain "
                 f"generate: +{grow[32] / 1024:.0f} MiB and +{grow[256] / 1024:.0f} MiB; "
                 f"{memory[256]['structures']} graphs for {memory[256]['steps']} steps")
    print(lines[-1], flush=True)
    report = {"machine": machine(), "runs": args.runs, "median_ms": med, "paired": paired,
              "stats": stats, "memory": memory}
    if args.peer:
        report["peer"] = peer = run_peer_steps()
        if "ms" in peer.get("episode", {}):
            ratio = peer["episode"]["ms"] / peer["plain_ms"]
            lines.append(f"  torchlens {peer['torchlens']} episode capture (every activation): "
                         f"{peer['episode']['ms'] / 1e3:.1f} s against its own plain generate "
                         f"{peer['plain_ms']:.0f} ms = {ratio:.0f}x ({peer['episode']['ops']:,} "
                         f"ops); tl save='all' is {ratio / (every / base):.0f}x faster "
                         "(ratio / ratio)")
        else:
            lines.append(f"  torchlens 2.36.1: no figure ({peer})")
        print(lines[-1], flush=True)
    save_results("steps", report, lines)


def run_peer_steps() -> dict:
    """``peer_steps.py`` in the bench-peer env: its JSON, or ``{"error": why}``."""
    from run import peer_python

    python, why = peer_python(None)
    if python is None:
        return {"error": why}
    done = subprocess.run([python, os.path.join(os.path.dirname(__file__), "peer_steps.py")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-800:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
