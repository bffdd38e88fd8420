"""The torchlens 2.36.1 peer, run by ``run.py`` in the ``bench-peer`` hatch env.

torchlens 2.36.1 imports as ``torchlens`` too, so it cannot share a process with this repository's
torchlens. This script times, in one process, the plain forward and 2.36.1's
``torchlens.trace(model, x)`` with its default selection (every activation saved), and prints one
line of JSON on stdout.

torchlens 2.36.1 wraps the torch functions on its first ``trace()`` and leaves them wrapped for the
rest of the process, which slows every later plain forward. So each round unwraps torch
(``torchlens.backends.torch.wrappers.unwrap_torch``, the spelling 2.36.1 itself points to), times
the clean plain forward (``--plain-per-round`` times: a 40 ms forward is the denominator of every
ratio, and one burst of load on a shared machine moves a single sample), re-wraps (``wrap_torch``),
then times the trace in its steady, already-wrapped state and the plain forward under the wrappers
(reported as ``plain_forward_wrapped``, not used for ratios). Wrapping and unwrapping are not
timed. If those functions are missing, the clean plain forwards are all timed first, before any
trace (``"interleaved": false`` in the JSON).

    python benchmarks/peer_torchlens.py --runs 5 --warmup 1 [--plain-per-round 3]
        [--models resnet18,gpt2] [--gpt2 lm]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _common import (  # noqa: E402
    GPT2_CLASSES,
    MODELS,
    build_model,
    machine,
    plain_forward,
    summarize,
    time_once,
    time_rounds,
)


def peer_trace(tl: Any, model: torch.nn.Module, x: Any):
    """2.36.1's capture with its defaults: ``save`` unset means every activation is saved."""

    def run() -> Any:
        with torch.no_grad():
            if isinstance(x, dict):
                return tl.trace(model, input_kwargs=x)
            return tl.trace(model, x)

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--plain-per-round", type=int, default=3,
                        help="clean plain forwards timed per round")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--gpt2", choices=GPT2_CLASSES, default="lm")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    warnings.simplefilter("ignore")  # 2.36.1 warns about GPT-2's mask code on every capture
    import torchlens as tl

    out: dict[str, Any] = {"tool": "torchlens", "version": getattr(tl, "__version__", "?"),
                           "machine": machine(), "runs": args.runs, "warmup": args.warmup,
                           "plain_per_round": args.plain_per_round, "models": {}}
    try:
        from torchlens.backends.torch.wrappers import unwrap_torch, wrap_torch
    except ImportError:
        unwrap_torch = wrap_torch = None
    out["interleaved"] = unwrap_torch is not None

    for name in [m for m in args.models.split(",") if m]:
        model, x = build_model(name, gpt2_class=args.gpt2)
        plain, trace = plain_forward(model, x), peer_trace(tl, model, x)
        entry: dict[str, Any] = {}
        clean: list[float] = []
        traced: list[float] = []
        wrapped: list[float] = []
        try:
            if unwrap_torch is None:  # clean plain forwards first, while torch may be unwrapped
                clean = time_rounds({"plain": plain}, runs=args.runs * args.plain_per_round,
                                    warmup=args.warmup)["plain"]
            for i in range(args.warmup + args.runs):
                keep = i >= args.warmup
                if unwrap_torch is not None:
                    unwrap_torch()
                    for _ in range(args.plain_per_round):
                        t = time_once(plain)
                        if keep:
                            clean.append(t)
                    wrap_torch()
                t = time_once(trace)
                if keep:
                    traced.append(t)
                t = time_once(plain)
                if keep:
                    wrapped.append(t)
            with torch.no_grad():
                tr = trace()
            entry["layers"] = len(tr)
            del tr
        except Exception as err:
            traceback.print_exc(file=sys.stderr)
            entry["error"] = f"{type(err).__name__}: {err}"
        entry["plain_forward"] = summarize(clean)
        entry["trace_all"] = summarize(traced)
        entry["plain_forward_wrapped"] = summarize(wrapped)
        out["models"][name] = entry
        del model, x, plain, trace
        gc.collect()

    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
