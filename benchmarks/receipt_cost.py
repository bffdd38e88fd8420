"""The pinned surfaces' receipt on a 1 GB state dict: its whole cost, against the crc32 it replaced.

``hatch run bench:receipt``: an nn.Module holding about 1 GB of float32 parameters (four large
matrices, 48 of 4 MB and 300 small ones, as a real model's mix), and:

- the receipt's whole cost: ``pinned(model, "bench")`` around an empty body (every slot's tensor,
  storage and version counter before and after, the flag and buffer snapshot, the restore; no
  tensor's bytes are read), median of 5 runs;
- one content fingerprint pass (``state_fingerprints``: what a store's model fingerprint and an
  ``intervention_ready`` baseline read), median of 5;
- the old receipt's fingerprint: a crc32 of every byte of every tensor, reimplemented here, two
  passes (before + after) a run, median of 5.

Results: ``results/receipt_cost.json`` and ``.md``, with the verdict against the target.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import statistics
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import torch
from _common import write_results
from torch import nn

from torchlens.capture.policy import pinned, state_fingerprints

HERE = Path(__file__).resolve().parent
TARGET_S = 0.2  # the receipt's whole cost (before + after) on a 1 GB state dict


def build(seed: int = 0) -> nn.Module:
    """About 1 GB of float32: 4 x 8192 x 6144, 48 x 1024 x 1024, 300 x 4096."""
    torch.manual_seed(seed)
    model = nn.Module()
    model.large = nn.ParameterList(nn.Parameter(torch.empty(8192, 6144).normal_())
                                   for _ in range(4))
    model.mid = nn.ParameterList(nn.Parameter(torch.empty(1024, 1024).normal_())
                                 for _ in range(48))
    model.small = nn.ParameterList(nn.Parameter(torch.empty(4096).normal_()) for _ in range(300))
    return model


def _crc(t: torch.Tensor) -> int:
    """The old fingerprint: zlib.crc32 over a tensor's bytes, read in place."""
    data = t.detach().cpu().contiguous()
    if data.numel() == 0:
        return 0
    raw = (ctypes.c_char * (data.numel() * data.element_size())).from_address(data.data_ptr())
    return zlib.crc32(raw)


def crc_fingerprints(model: nn.Module) -> dict[str, str]:
    """The old ``state_fingerprints``: ``shape|dtype|crc32`` of every parameter and buffer."""
    tensors = [*model.named_parameters(remove_duplicate=False),
               *model.named_buffers(remove_duplicate=False)]
    return {name: f"{tuple(t.shape)}|{t.dtype}|{_crc(t):08x}" for name, t in tensors}


def median_s(fn: Callable[[], object], runs: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def receipt(model: nn.Module) -> None:
    with pinned(model, "bench"):
        pass


def old_receipt(model: nn.Module) -> None:
    crc_fingerprints(model)
    crc_fingerprints(model)


def markdown(res: dict) -> str:
    new, old = res["receipt_s"], res["old_crc_receipt_s"]
    verdict = "PASS" if new < TARGET_S else "MISS"
    return "\n".join([
        "# The pinned surfaces' receipt on a 1 GB state dict", "",
        f"Machine: {res['machine']}; torch threads: {res['threads']}; load average before / "
        f"after: {res['load_before']} / {res['load_after']}.",
        f"Model: {res['tensors']} float32 parameters, {res['bytes'] / 1e9:.3f} GB "
        "(4 x 8192 x 6144, 48 x 1024 x 1024, 300 x 4096). Median of "
        f"{res['runs']} runs.", "",
        "| what | median | all runs |", "|---|---:|---|",
        f"| receipt: `pinned(model)` around an empty body (before + after) | {new:.3f} s | "
        f"{_runs(res['receipt_runs'])} |",
        f"| one fingerprint pass (`state_fingerprints`) | {res['fingerprint_s']:.3f} s | "
        f"{_runs(res['fingerprint_runs'])} |",
        f"| old receipt: crc32 of every byte, before + after | {old:.3f} s | "
        f"{_runs(res['old_crc_receipt_runs'])} |", "",
        f"Verdict: the receipt costs {new:.3f} s against a target of < {TARGET_S} s: {verdict} "
        f"({old / new:.1f}x cheaper than the crc32 receipt).", ""])


def _runs(times: list[float]) -> str:
    return ", ".join(f"{t:.3f}" for t in times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", default=str(HERE / "results" / "receipt_cost.json"))
    args = parser.parse_args()
    model = build()
    params = list(model.parameters())
    load_before = os.getloadavg()
    receipt(model)  # first touch: allocator and caches, not timed
    new, new_runs = median_s(lambda: receipt(model), args.runs)
    one, one_runs = median_s(lambda: state_fingerprints(model), args.runs)
    old, old_runs = median_s(lambda: old_receipt(model), args.runs)
    res = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}",
           "threads": torch.get_num_threads(), "runs": args.runs, "tensors": len(params),
           "bytes": sum(p.numel() * p.element_size() for p in params),
           "load_before": " ".join(f"{x:.2f}" for x in load_before),
           "load_after": " ".join(f"{x:.2f}" for x in os.getloadavg()),
           "receipt_s": new, "receipt_runs": new_runs, "fingerprint_s": one,
           "fingerprint_runs": one_runs, "old_crc_receipt_s": old, "old_crc_receipt_runs": old_runs,
           "target_s": TARGET_S, "pass": new < TARGET_S}
    write_results(args.json, res, markdown(res))


if __name__ == "__main__":
    main()
