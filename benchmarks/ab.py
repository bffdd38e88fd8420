"""A/B of two revisions of torchlens-core: the rows of ``bench:run``, ``bench:steps`` and
``bench:edits`` that a refactor must not slow down, for a git revision (A) and the working tree
(B), timed call against call.

    hatch run bench:ab --base e083b49            # the A/B
    hatch run bench:ab --base HEAD --save ab_aa.txt   # A/A on a clean tree: the host alone

Revision A's ``torchlens`` package is copied from a temporary worktree under another name
(``torchlens_a``: its imports are relative), so both import side by side in one process. On a
shared host a single process is not enough: a forward moves by 6-30% from one call to the next,
and a process's own memory layout can favour one side by a few percent (an A/A run in one process
misses 3% about as often as the A/B does). So the rounds are spread over ``--procs`` processes,
each with its own hash seed and with the two packages imported in alternating order; within a
round each row's A and B calls run back to back (their order alternating), each after a
``gc.collect()``. B / A is the median of all the pairs' ratios, with a 95%
interval from resampling processes, then pairs (target: within 3%). Plugins are not loaded
(``TORCHLENS_DISABLE_PLUGINS``): the plugins of the working tree import its torchlens, not A's.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# rounds per process and model by default: the cheap model gets more, so that every model
# takes a few minutes
ROUNDS = {"tinyops": 120, "resnet18": 40, "gpt2": 30}


def copy_base(rev: str, folder: Path) -> Path:
    """Revision ``rev``'s torchlens, copied as ``folder/torchlens_a``; returns ``folder``."""
    tree = folder / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        shutil.copytree(tree / "packages" / "torchlens-core" / "src" / "torchlens",
                        folder / "pkgs" / "torchlens_a")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                       capture_output=True)
    return folder / "pkgs"


def interval(per_proc: list[list[float]], draws: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median ratio: processes resampled, then pairs in each."""
    rng = random.Random(0)
    medians = []
    for _ in range(draws):
        pooled = [r for proc in rng.choices(per_proc, k=len(per_proc))
                  for r in rng.choices(proc, k=len(proc))]
        medians.append(statistics.median(pooled))
    medians.sort()
    return medians[int(0.025 * draws)], medians[int(0.975 * draws)]


def edits_for(name: str, model: Any, x: Any, tl: Any) -> dict[str, Any]:
    """The module and op edit rows' sites and edits of one model (none for tinyops)."""
    import torch

    torch.manual_seed(1)
    if name == "resnet18":
        steer = torch.randn(28)
        return {"module": ("layer2.0", lambda tl, v=steer: tl.edits.add(v)),
                "op": ("layer1.0.relu:2", lambda tl: tl.edits.zero(index=(slice(None), 5)))}
    if name == "gpt2":
        steer = torch.randn(768)
        with torch.no_grad():
            add = next(op.label for op in tl.trace(model, x, save=None)
                       if op.func == "add" and op.module == "transformer.h.6")
        return {"module": ("transformer.h.6", lambda tl, v=steer: tl.edits.add(v)),
                "op": (add, lambda tl: tl.edits.zero(index=(slice(None), 4)))}
    return {}


def rows(tl: Any, name: str, model: Any, x: Any, edit_sites: dict) -> dict[str, Any]:
    """The timed calls of one side on one model."""
    import torch
    from _common import call

    def traced(**kw: Any) -> Any:
        def run() -> Any:
            with torch.no_grad():
                return tl.trace(model, x, **kw)
        return run

    out = {f"{name} trace(save=None)": traced(save=None),
           f"{name} trace(save='all')": traced(save="all")}
    for kind, (site, make) in edit_sites.items():
        out[f"{name} {kind} edit"] = traced(save=None, edits={site: make(tl)})

    def steps() -> Any:  # tl.steps over a loop of forwards, as tl.generate runs generate
        with torch.no_grad(), tl.steps(model) as run:
            for _ in range(4):
                call(model, x)
        return run

    out[f"{name} 4 steps(save=None)"] = steps
    return out


def child(args: argparse.Namespace) -> None:
    """One process: ``args.runs`` rounds of every row's A and B calls; samples to ``args.out``."""
    import gc

    import torch
    from _common import build_model, call, time_once

    sys.path.insert(0, args.pkgs)
    first, second = ("torchlens_a", "torchlens") if args.a_first else ("torchlens", "torchlens_a")
    loaded = {mod: importlib.import_module(mod) for mod in (first, second)}
    tl_a, tl_b = loaded["torchlens_a"], loaded["torchlens"]
    torch.set_num_threads(1)
    model, x = build_model(args.models)
    edit_sites = edits_for(args.models, model, x, tl_b)

    def plain() -> Any:
        with torch.no_grad():
            return call(model, x)

    a, b = rows(tl_a, args.models, model, x, edit_sites), rows(tl_b, args.models, model, x,
                                                                edit_sites)
    for fn in (plain, *a.values(), *b.values()):  # warm: first calls fill caches
        for _ in range(2):
            fn()
    names = list(a)
    samples: dict[str, Any] = {"plain": [], **{row: [] for row in names}}

    def timed(fn: Any) -> float:
        gc.collect()
        return time_once(fn)

    for r in range(args.runs):
        samples["plain"].append(timed(plain))
        for row in names[r % len(names):] + names[:r % len(names)]:
            if (r + args.a_first) % 2:
                ta = timed(a[row])
                tb = timed(b[row])
            else:
                tb = timed(b[row])
                ta = timed(a[row])
            samples[row].append((ta, tb))
    Path(args.out).write_text(json.dumps(samples))


def run_procs(name: str, pkgs: Path, tmp: Path, procs: int, runs: int) -> list[dict[str, Any]]:
    """Each process's samples for one model (hash seed and import order vary by process)."""
    out = []
    for p in range(procs):
        path = tmp / f"{name}.{p}.json"
        env = {**os.environ, "PYTHONHASHSEED": str(p + 1), "TORCHLENS_DISABLE_PLUGINS": "1"}
        subprocess.run([sys.executable, __file__, "--child", "--pkgs", str(pkgs), "--models", name,
                        "--runs", str(runs), "--out", str(path), "--a-first", str(p % 2)],
                       check=True, env=env, cwd=Path(__file__).parent)
        out.append(json.loads(path.read_text()))
    return out


def report(name: str, results: list[dict[str, Any]]) -> list[str]:
    """One line per row: A and B over the plain call (medians), B / A with its interval."""
    plain = statistics.median(t for res in results for t in res["plain"])
    lines = []
    for row in [k for k in results[0] if k != "plain"]:
        pairs = [res[row] for res in results]
        ra = statistics.median(ta for proc in pairs for ta, _ in proc) / plain
        rb = statistics.median(tb for proc in pairs for _, tb in proc) / plain
        per_proc = [[tb / ta for ta, tb in proc] for proc in pairs]
        ratio = statistics.median(r for proc in per_proc for r in proc)
        low, high = interval(per_proc)
        spread = ", ".join(f"{statistics.median(proc):.3f}" for proc in per_proc)
        verdict = "PASS" if ratio <= 1.03 else "MISS"
        lines.append(f"  {row:28s} A {ra:6.3f}x  B {rb:6.3f}x  B/A {ratio:.3f} "
                     f"[{low:.3f}, {high:.3f}] ({verdict}); by process {spread}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="the git revision A")
    parser.add_argument("--procs", type=int, default=4, help="processes per model")
    parser.add_argument("--runs", type=int, default=None,
                        help=f"rounds per process (default by model: {ROUNDS})")
    parser.add_argument("--models", default="tinyops,resnet18,gpt2")
    parser.add_argument("--save", default="ab.txt", help="the file under results/ to write")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--pkgs", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--a-first", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    if not args.base:
        parser.error("--base is required")
    head = [f"A = {args.base}, B = the working tree; {args.procs} processes per model, every "
            "row's A and B calls back to back in each round; ratios to the plain forward "
            "(medians), B / A the median of the pairs' ratios with its 95% interval, and each "
            "process's median (target: within 3%)"]
    lines: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        pkgs = copy_base(args.base, Path(tmp))
        for name in args.models.split(","):
            runs = args.runs or ROUNDS.get(name, 40)
            block = [f" {name}: {runs} rounds x {args.procs} processes",
                     *report(name, run_procs(name, pkgs, Path(tmp), args.procs, runs))]
            print("\n".join(block), flush=True)
            lines += block
    print("\n".join(head + lines))
    (Path(__file__).parent / "results" / args.save).write_text("\n".join(head + lines) + "\n")


if __name__ == "__main__":
    main()
