"""``bench:ab``'s rows counted in CPU instructions instead of timed: what a refactor adds to
the work of a capture, free of the host's noise.

    hatch run bench:ab-count --base e083b49     # --models tinyops (the default), --calls 2

A shared host moves a forward by 6% to 30% from one call to the next, so the timed A/B needs
four processes and half an hour for intervals of about ±1-2%; a count (``_counting``) moves by
about half a percent from one run to the next, from one process a side. Each side (A: the
revision's ``torchlens`` copied as ``torchlens_a``; B: the working tree) runs in its own process
under callgrind. Rows are reported as instructions per call over the plain call's, and B / A.
tinyops is the default: its rows are the capture's own work (dispatch-bound); a row of resnet18
or GPT-2 runs its kernels' billions of instructions under callgrind, about 4 minutes a row and
side here.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from _counting import count_rows, counted  # noqa: E402
from ab import copy_base, edits_for, rows  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def child(side: str, models: list[str], calls: int, out: Path) -> None:
    """Inside valgrind: count every row of one side, one dump per row."""
    os.environ["TORCHLENS_DISABLE_PLUGINS"] = "1"
    import torch
    from _common import build_model, call

    tl: Any = __import__("torchlens_a" if side == "A" else "torchlens")
    torch.set_num_threads(1)
    for name in models:
        model, x = build_model(name)

        def plain(model: Any = model, x: Any = x) -> Any:
            with torch.no_grad():
                return call(model, x)

        count_rows({f"{name} plain": plain,
                    **rows(tl, name, model, x, edits_for(name, model, x, tl))}, calls, out)


def count(side: str, args: argparse.Namespace, tmp: Path, pkgs: Path) -> dict[str, float]:
    """Run one side under callgrind; instructions per call of each row."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(pkgs), os.environ.get("PYTHONPATH", "")]))
    return counted(__file__, ["--child", side, "--models", args.models, "--calls",
                              str(args.calls)], tmp, side, args.calls, env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="the git revision A")
    parser.add_argument("--models", default="tinyops")
    parser.add_argument("--calls", type=int, default=2, help="counted calls of each row")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.models.split(","), args.calls, Path(args.child_out))
        return
    if not args.base:
        parser.error("--base is required")
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        pkgs = copy_base(args.base, tmp)  # A's package, as pkgs/torchlens_a
        a, b = count("A", args, tmp, pkgs), count("B", args, tmp, pkgs)
    lines = [f"A = {args.base}, B = the working tree; CPU instructions per call under "
             f"callgrind ({args.calls} counted calls a row, one thread), as ratios to the "
             "plain call's, and B / A (target: within 3%)"]
    for model in args.models.split(","):
        plain_a, plain_b = a[f"{model} plain"], b[f"{model} plain"]
        for row in a:
            if not row.startswith(f"{model} ") or row.endswith(" plain"):
                continue
            ratio = b[row] / a[row]
            verdict = "PASS" if ratio <= 1.03 else "MISS"
            lines.append(f"  {row:32s} A {a[row] / plain_a:6.3f}x  B {b[row] / plain_b:6.3f}x"
                         f"  B/A {ratio:.3f} ({verdict})  {b[row] / 1e6:8.1f}M instructions")
    print("\n".join(lines))
    (RESULTS / "ab_count.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
