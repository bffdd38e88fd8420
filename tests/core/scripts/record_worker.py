"""A recording job run as its own process: by the SIGKILL test, and by torchrun with 2 ranks.

Builds the same seeded model and inputs in every process, then records them to ``--to``.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

import torchlens as tl


class Slow(nn.Module):
    """Two layers; ``delay`` seconds per forward give a kill something to interrupt."""

    def __init__(self, delay: float):
        super().__init__()
        self.delay = delay
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 8)

    def forward(self, x):
        if self.delay:
            time.sleep(self.delay)
        return self.b(torch.relu(self.a(x)))


def build(n: int, delay: float = 0.0) -> tuple[nn.Module, list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    model = Slow(delay)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.rand(p.shape, generator=gen) - 0.5)
    # batches of different sizes: rows per input differ, so rank interleaving is by input
    inputs = [torch.rand(1 + k % 3, 16, generator=gen) for k in range(n)]
    return model.eval(), inputs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--to", required=True)
    parser.add_argument("-n", type=int, default=12)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--shard-bytes", type=int, default=1)
    args = parser.parse_args()
    model, inputs = build(args.n, args.delay)
    tl.record(model, inputs, save=["a", "relu_1"], to=args.to, shard_bytes=args.shard_bytes,
              progress=False)


if __name__ == "__main__":
    main()
