"""A/B of two revisions of TorchLens in one run: the rows of ``bench:run``, ``bench:steps`` and
``bench:edits`` that a refactor must not slow down, each as a ratio to the plain call measured
in the same process, for the working tree (B) and a git revision (A, checked out in a
temporary worktree), in alternating child processes, round after round.

    hatch run bench:ab --base e083b49 --rounds 3

A child imports one revision's packages (``PYTHONPATH``: its ``src`` folders come before the
installed workspace) and times every row in rounds of its own (``_common.time_rounds``); the
driver reports each row's median ratio over the children of each side, and B / A.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torchlens-core", "torchlens-viz", "torchlens-hf", "torchlens-vision")


def child(runs: int) -> None:
    """Time every row against its plain call in this process; print the ratios as JSON."""
    import torch
    from _common import build_model, call, time_rounds
    from edits import sites
    from steps import setup

    import torchlens as tl

    torch.set_num_threads(1)
    ratios: dict[str, float] = {}

    def plain(model, x):
        def run():
            with torch.no_grad():
                return call(model, x)
        return run

    def traced(model, x, **kw):
        def run():
            with torch.no_grad():
                return tl.trace(model, x, **kw)
        return run

    for name in ("resnet18", "gpt2"):
        model, x = build_model(name)
        methods = {"plain": plain(model, x), "save=None": traced(model, x, save=None),
                   "save=all": traced(model, x, save="all")}
        for kind, (site, edit, _) in sites(model, x, name).items():
            methods[f"{kind} edit"] = traced(model, x, save=None, edits={site: edit})
        samples = time_rounds(methods, runs=runs, warmup=2)
        med = {k: statistics.median(v) for k, v in samples.items()}
        ratios[f"run: {name} trace(save=None) / forward"] = med["save=None"] / med["plain"]
        ratios[f"run: {name} trace(save='all') / forward"] = med["save=all"] / med["plain"]
        for kind in ("module", "op"):
            ratios[f"edits: {name} {kind} edit / unedited trace"] = (
                med[f"{kind} edit"] / med["save=None"])
    model, ids, options = setup(32)

    def generate():
        with torch.no_grad():
            return model.generate(ids, **options)

    steps = {"plain": generate,
             "save=None": lambda: tl.generate(model, ids, save=None, **options)}
    samples = time_rounds(steps, runs=max(3, runs // 4), warmup=1, block=1)
    paired = statistics.median(a / b for a, b in zip(samples["save=None"], samples["plain"]))
    ratios["steps: gpt2 generate(save=None) / generate, paired"] = paired
    print(json.dumps(ratios))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision A")
    parser.add_argument("--rounds", type=int, default=3, help="children per side")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per row in a child")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.runs)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            sides = {"A": base, "B": ROOT}
            results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
            for r in range(args.rounds):
                for side in ("A", "B") if r % 2 == 0 else ("B", "A"):
                    src = os.pathsep.join(str(sides[side] / "packages" / p / "src")
                                          for p in PACKAGES)
                    env = dict(os.environ, PYTHONPATH=src + os.pathsep +
                               os.environ.get("PYTHONPATH", ""))
                    done = subprocess.run([sys.executable, __file__, "--child", "--runs",
                                           str(args.runs)], env=env, capture_output=True,
                                          text=True, cwd=Path(__file__).parent, check=True)
                    results[side].append(json.loads(done.stdout.strip().splitlines()[-1]))
                    print(f"round {r + 1} {side} done", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT,
                           capture_output=True)
    lines = [f"A = {args.base}, B = the working tree; {args.rounds} child processes each, "
             f"{args.runs} runs a row; the median of each side's ratios, and B / A "
             "(target: within 3%)"]
    for row in results["A"][0]:
        a = statistics.median(res[row] for res in results["A"])
        b = statistics.median(res[row] for res in results["B"])
        verdict = "PASS" if b / a <= 1.03 else "MISS"
        lines.append(f"  {row:55s} A {a:.3f}x  B {b:.3f}x  B/A {b / a:.3f} ({verdict})")
    print("\n".join(lines))
    (Path(__file__).parent / "results" / "ab.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
