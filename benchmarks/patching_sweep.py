"""A patching sweep on a 12-layer GPT-2: ``tl.patching.sweep`` against the same grid written by
hand with ``register_forward_hook``, and nnsight 0.8 beside them.

Run ``hatch run bench:sweep`` (``--rounds 2``). GPT-2 is ``GPT2Config()`` (12 layers, 768 wide,
random weights, eval), 16 token ids; the corrupt prompt differs from the clean one at every
position. The grid: the 12 block outputs (``transformer.h.*``, the residual stream) x the 16
positions, 192 cells; a cell patches the clean block output at one position into the corrupt
run; the metric is a logit difference at the last position. Every method computes the clean
values once per grid and the whole grid; each grid is timed end to end, the methods in a
rotating order, ``rounds`` times; the median grid time is reported. All grids are checked to
agree with the hand-written one before any time counts.

Targets (issue 45): ``batch_size=1`` costs at most 1.15x the hand-written loop; batched
(``batch_size=16`` or ``64``, the faster) is at least 3x faster than it. Paired (issue 61 §7):
on GPT-2 12 layers 256 wide, each ``batch_size=1`` grid runs right beside a hook-loop grid
(which first alternates), ``--pairs`` times; the median of their ratios is at most 1.05x.
``--only-paired`` runs that part alone. Results: ``benchmarks/results/sweep.*``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import build_model, machine  # noqa: E402

import torchlens as tl  # noqa: E402

HERE = os.path.dirname(__file__)
SEQ = 16
A, B = 1234, 4321  # the logit difference's two tokens


def metric(out: Any) -> torch.Tensor:
    logits = out.logits if hasattr(out, "logits") else out["logits"]
    return logits[0, -1, A] - logits[0, -1, B]


def by_hand(model, clean, corrupt) -> torch.Tensor:
    """The grid with forward hooks: save each block's clean output, then patch cell by cell."""
    blocks = list(model.transformer.h)
    grid = torch.empty(len(blocks), SEQ, dtype=torch.float64)
    with torch.no_grad():
        saved: dict[int, torch.Tensor] = {}
        handles = [b.register_forward_hook(lambda m, a, o, i=i: saved.__setitem__(i, o))
                   for i, b in enumerate(blocks)]
        model(**clean)
        for h in handles:
            h.remove()
        for i, block in enumerate(blocks):
            for p in range(SEQ):
                def patch(m, a, o, i=i, p=p):
                    o[:, p] = saved[i][:, p]  # in place, no copy: the leanest hook
                    return o
                handle = block.register_forward_hook(patch)
                try:
                    grid[i, p] = float(metric(model(**corrupt)))
                finally:
                    handle.remove()
    return grid


def with_torchlens(model, clean, corrupt, batch_size: int) -> torch.Tensor:
    return tl.patching.sweep(model, clean, corrupt, sites=["transformer.h.*"], metric=metric,
                             batch_size=batch_size).raw


def with_nnsight(model, clean, corrupt) -> torch.Tensor:
    import nnsight
    from nnsight import NNsight

    lm = NNsight(model)
    n = len(model.transformer.h)
    grid = torch.empty(n, SEQ, dtype=torch.float64)
    with torch.no_grad():
        with lm.trace(**clean):
            saved = nnsight.save([lm.transformer.h[i].output for i in range(n)])
        for i in range(n):
            for p in range(SEQ):
                with lm.trace(**corrupt):
                    lm.transformer.h[i].output[:, p] = saved[i][:, p]
                    value = metric(lm.output).save()
                grid[i, p] = float(value)
    return grid


def paired(pairs: int) -> dict:
    """``batch_size=1`` grids each beside a hook-loop grid, on GPT-2 12 layers 256 wide."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=256, n_head=4, use_cache=False)).eval()
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, SEQ))
    clean, corrupt = {"input_ids": ids}, {"input_ids": (ids + 7) % model.config.vocab_size}
    hand = lambda: by_hand(model, clean, corrupt)  # noqa: E731
    ours = lambda: with_torchlens(model, clean, corrupt, 1)  # noqa: E731
    auto = lambda: tl.patching.sweep(model, clean, corrupt, sites=["transformer.h.*"],  # noqa
                                     metric=metric)
    assert float((ours() - hand()).abs().max()) < 1e-4
    def timed(fn) -> float:
        gc.collect()
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    ratios, auto_ratios = [], []
    for k in range(pairs):
        order = [("hand", hand), ("ours", ours)] if k % 2 == 0 else [("ours", ours),
                                                                     ("hand", hand)]
        took = {name: timed(fn) for name, fn in order}
        ratios.append(took["ours"] / took["hand"])
        print(f"pair {k}: hook loop {took['hand']:.2f} s, batch_size=1 {took['ours']:.2f} s "
              f"({ratios[-1]:.3f}x)", flush=True)
    # the default's batched grids, apart (their large allocations would move the pairs' times)
    for _ in range(2):
        took = {name: timed(fn) for name, fn in (("hand", hand), ("auto", auto))}
        auto_ratios.append(took["auto"] / took["hand"])
        print(f"default (16 cells a forward): {auto_ratios[-1]:.3f}x the hook loop", flush=True)
    return {"ratios": ratios, "median": statistics.median(ratios),
            "auto_ratios": auto_ratios, "auto_median": statistics.median(auto_ratios)}


def _paired_lines(p: dict) -> list[str]:
    return [f"paired, GPT-2 12 layers 256 wide, {len(p['ratios'])} pairs: batch_size=1 over "
            f"the hook loop beside it {', '.join(f'{r:.3f}' for r in p['ratios'])}",
            f"target batch_size=1 <= 1.05x the hook loop beside it (median): "
            f"{p['median']:.3f}x {'PASS' if p['median'] <= 1.05 else 'MISS'}",
            f"the default (batches where the rows are independent): {p['auto_median']:.3f}x "
            "the hook loop"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--only-paired", action="store_true")
    parser.add_argument("--no-nnsight", action="store_true")
    args = parser.parse_args()
    if args.only_paired:
        pairs = paired(args.pairs)
        lines = _paired_lines(pairs)
        print("\n".join(lines))
        with open(os.path.join(HERE, "results", "sweep_paired.json"), "w",
                  encoding="utf-8") as fh:
            json.dump({"machine": machine(), **pairs}, fh, indent=1)
        with open(os.path.join(HERE, "results", "sweep_paired.txt"), "w",
                  encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        return
    model, _ = build_model("gpt2")
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, SEQ))
    clean = {"input_ids": ids}
    corrupt = {"input_ids": (ids + 7) % model.config.vocab_size}
    methods = {
        "hook loop": lambda: by_hand(model, clean, corrupt),
        "tl.patching.sweep batch_size=1": lambda: with_torchlens(model, clean, corrupt, 1),
        "tl.patching.sweep batch_size=16": lambda: with_torchlens(model, clean, corrupt, 16),
        "tl.patching.sweep batch_size=64": lambda: with_torchlens(model, clean, corrupt, 64),
    }
    if not args.no_nnsight:
        methods["nnsight 0.8"] = lambda: with_nnsight(model, clean, corrupt)
    reference = methods["hook loop"]()
    agree = {}
    for name, fn in methods.items():
        grid = fn()
        agree[name] = float((grid - reference).abs().max())
        print(f"{name}: largest difference from the hook loop {agree[name]:.2e}", flush=True)
    times: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            gc.collect()
            t0 = time.perf_counter()
            methods[name]()
            times[name].append(time.perf_counter() - t0)
            print(f"round {r}: {name} {times[name][-1]:.2f} s", flush=True)
    med = {name: statistics.median(v) for name, v in times.items()}
    hand = med["hook loop"]
    lines = [f"GPT-2 (12 layers, 768 wide), {SEQ} tokens, 12 sites x {SEQ} positions = "
             f"{12 * SEQ} cells; median of {args.rounds} grids, {torch.get_num_threads()} "
             "threads"]
    for name, seconds in med.items():
        lines.append(f"{name:34s} {seconds:7.2f} s  {seconds / hand:5.2f}x the hook loop "
                     f"(max diff {agree[name]:.1e})")
    one = med["tl.patching.sweep batch_size=1"]
    many = min(med["tl.patching.sweep batch_size=16"], med["tl.patching.sweep batch_size=64"])
    lines.append(f"target batch_size=1 <= 1.15x the hook loop: {one / hand:.3f}x "
                 f"{'PASS' if one / hand <= 1.15 else 'MISS'}")
    lines.append(f"target batched >= 3x faster than the hook loop: {hand / many:.2f}x "
                 f"{'PASS' if hand / many >= 3 else 'MISS'}")
    pairs = paired(args.pairs)
    lines += _paired_lines(pairs)
    print("\n".join(lines))
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", "sweep.json"), "w", encoding="utf-8") as fh:
        json.dump({"machine": machine(), "seconds": times, "median_s": med,
                   "max_abs_diff": agree, "paired": pairs}, fh, indent=1)
    with open(os.path.join(HERE, "results", "sweep.txt"), "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
