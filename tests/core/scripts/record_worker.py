"""A recording job run as its own process: by the SIGKILL test, and by torchrun with 2 ranks.

Builds the same seeded model and inputs in every process, then records them to ``--to``.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import sys
import time
from functools import partial

import torch
from torch import nn

import torchlens as tl


class Slow(nn.Module):
    """Two layers; ``delay`` seconds per forward give a kill something to interrupt."""

    def __init__(self, delay: float, fail_after: int | None = None):
        super().__init__()
        self.delay, self.fail_after, self.calls = delay, fail_after, 0
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x):
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise RuntimeError("this rank fails on purpose")
        if self.delay:
            time.sleep(self.delay)
        return self.b(torch.relu(self.a(x)))


def build(n: int, delay: float = 0.0, fail_after: int | None = None
          ) -> tuple[nn.Module, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    model = Slow(delay, fail_after)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) - 0.5)
    # batches of different sizes: rows per input differ, so rank interleaving is by input
    inputs = [torch.rand(1 + k % 3, 16, generator=gen) for k in range(n)]
    return model.eval(), inputs


def loader(n: int, distributed: bool):
    """``n`` examples in batches of 2; under torchrun through a DistributedSampler."""
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    data = TensorDataset(torch.rand(n, 16, generator=torch.Generator().manual_seed(5)))
    sampler = DistributedSampler(data, shuffle=False) if distributed else None
    return DataLoader(data, batch_size=2, sampler=sampler)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--to", required=True)
    parser.add_argument("-n", type=int, default=12)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--shard-bytes", type=int, default=1)
    parser.add_argument("--fail-rank", type=int, help="this rank raises after --fail-after "
                        "forwards")
    parser.add_argument("--fail-after", type=int, default=2)
    parser.add_argument("--loader", action="store_true", help="a DataLoader (a "
                        "DistributedSampler under torchrun) instead of a list")
    parser.add_argument("--compile", action="store_true", help="record through torch.compile")
    parser.add_argument("--file-limit-after", type=int, help="from this forward on, no file "
                        "may grow past 64 bytes (RLIMIT_FSIZE): every write fails, as on a "
                        "full disk")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    fail = args.fail_after if args.fail_rank == rank else None
    model, inputs = build(args.n, args.delay, fail)
    if args.loader:
        torch.distributed.init_process_group("gloo")  # the user's own group, as it is
        inputs = loader(args.n, distributed=True)
    if args.file_limit_after is not None:
        model.register_forward_pre_hook(partial(limit_files, after=args.file_limit_after))
    try:
        tl.record(model, inputs, save=["a", "relu_1"], to=args.to,
                  shard_bytes=args.shard_bytes, progress=False, compile=args.compile)
    except tl.TorchLensError as err:
        print(f"{err.code}: {err.message}", flush=True)
        sys.exit(3)


def limit_files(model: nn.Module, args: tuple, after: int) -> None:
    if model.calls + 1 == after:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY))


if __name__ == "__main__":
    main()
