"""A/B of two revisions of torchlens-core in one process: the rows of ``bench:run``,
``bench:steps`` and ``bench:edits`` that a refactor must not slow down, for a git revision (A)
and the working tree (B), timed in the same rounds.

    hatch run bench:ab --base e083b49

Revision A's ``torchlens`` package is copied from a temporary worktree under another name
(``torchlens_a``: its imports are relative), so both import side by side and every round
times every row of both, back to back (``_common.time_rounds``): the machine's drift falls on
both alike. Each row is reported as A and B over the plain call, and B / A by the median of the
per-round ratios (target: within 3%). Plugins are not loaded (``TORCHLENS_DISABLE_PLUGINS``):
the plugins of the working tree import its torchlens, not A's.
"""

from __future__ import annotations

import argparse
import importlib
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


def load_base(rev: str, folder: Path) -> Any:
    """Revision ``rev``'s torchlens, imported as ``torchlens_a``."""
    tree = folder / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=ROOT, check=True,
                   capture_output=True)
    try:
        shutil.copytree(tree / "packages" / "torchlens-core" / "src" / "torchlens",
                        folder / "pkgs" / "torchlens_a")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                       capture_output=True)
    sys.path.insert(0, str(folder / "pkgs"))
    return importlib.import_module("torchlens_a")


def interval(ratios: list[float], draws: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of the per-round ratios (rounds resampled)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(draws))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the git revision A")
    parser.add_argument("--runs", type=int, default=30, help="rounds (every row once each)")
    parser.add_argument("--models", default="tinyops,resnet18,gpt2")
    args = parser.parse_args()
    os.environ["TORCHLENS_DISABLE_PLUGINS"] = "1"
    import torch
    from _common import build_model, call, time_rounds

    import torchlens as tl_b

    torch.set_num_threads(1)
    lines = [f"A = {args.base}, B = the working tree, in one process; {args.runs} rounds, every "
             "row of both in each; ratios to the plain forward (medians), B / A the median of "
             "the per-round ratios, with its 95% interval (target: within 3%)"]
    with tempfile.TemporaryDirectory() as tmp:
        tl_a = load_base(args.base, Path(tmp))
        for name in args.models.split(","):
            model, x = build_model(name)
            edit_sites = edits_for(name, model, x, tl_b)

            def plain(model: Any = model, x: Any = x) -> Any:
                with torch.no_grad():
                    return call(model, x)

            a, b = rows(tl_a, name, model, x, edit_sites), rows(tl_b, name, model, x, edit_sites)
            methods = {"plain": plain, **{f"A {k}": v for k, v in a.items()},
                       **{f"B {k}": v for k, v in b.items()}}
            samples = time_rounds(methods, runs=args.runs, warmup=2, block=1)
            base = statistics.median(samples["plain"])
            for row in a:
                ra = statistics.median(samples[f"A {row}"]) / base
                rb = statistics.median(samples[f"B {row}"]) / base
                ratios = [q / p for p, q in zip(samples[f"A {row}"], samples[f"B {row}"])]
                paired = statistics.median(ratios)
                low, high = interval(ratios)
                verdict = "PASS" if paired <= 1.03 else "MISS"
                lines.append(f"  {row:32s} A {ra:6.3f}x  B {rb:6.3f}x  B/A {paired:.3f} "
                             f"[{low:.3f}, {high:.3f}] ({verdict})")
            print("\n".join(lines[-len(a):]), flush=True)
            del model, x, methods, samples
    print("\n".join(lines))
    (Path(__file__).parent / "results" / "ab.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
