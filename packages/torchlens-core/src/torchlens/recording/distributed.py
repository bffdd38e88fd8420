"""Scale-out under torchrun: each rank records its own share of the inputs.

Ranks share nothing but barriers and their shard names: rank r takes inputs r, r + N, ... (or
its own ``DistributedSampler`` batches as they are), and rank 0 merges the ranks' manifests
once all are done. The process group is the user's, or one started from torchrun's variables
and closed again afterwards.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .manifest import RecordingError

TORCHRUN_TEACH = "torchrun --nproc-per-node 2 script.py  # sets RANK, WORLD_SIZE, MASTER_ADDR"


@dataclass
class Ranks:
    """This process's place: rank, world size, and whether TorchLens started the group."""

    rank: int = 0
    world: int = 1
    started: bool = False


def join(model: nn.Module) -> Ranks:
    """The running process group, one started from torchrun's variables, or a single rank."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size())
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return Ranks()
    on_gpu = any(p.device.type == "cuda" for p in itertools.islice(model.parameters(), 1))
    backend = "nccl" if on_gpu and dist.is_nccl_available() else "gloo"
    try:
        if not dist.is_available():
            raise RuntimeError("this torch build has no torch.distributed")
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    except (RuntimeError, ValueError) as exc:
        raise RecordingError(
            f"WORLD_SIZE={world} is set, but the {backend} process group could not start: "
            f"{exc}", code="distributed_unavailable",
            teach=[TORCHRUN_TEACH, "torch.distributed.init_process_group('gloo')  # yourself, "
                   "before tl.record"]) from exc
    return Ranks(dist.get_rank(), dist.get_world_size(), started=True)


def barrier(ranks: Ranks) -> None:
    if ranks.world > 1:
        import torch.distributed as dist

        dist.barrier()


def leave(ranks: Ranks) -> None:
    """Close the group if TorchLens started it: the process is left as it was found."""
    if ranks.started:
        import torch.distributed as dist

        dist.destroy_process_group()


def uses_distributed_sampler(inputs: Any) -> bool:
    """A DataLoader that already gives each rank its own examples."""
    from torch.utils.data.distributed import DistributedSampler

    sampler = getattr(inputs, "sampler", None)
    batch_sampler = getattr(inputs, "batch_sampler", None)
    return isinstance(sampler, DistributedSampler) or isinstance(
        getattr(batch_sampler, "sampler", None), DistributedSampler)


def share(inputs: Iterable, ranks: Ranks, presplit: bool) -> tuple[Iterable, str]:
    """This rank's inputs, and how the store interleaves ranks ("items" or "rows").
    ``presplit``: the inputs came from a DataLoader with a DistributedSampler."""
    if ranks.world == 1:
        return inputs, "items"
    if presplit:
        return inputs, "rows"
    if isinstance(inputs, (list, tuple)):
        return inputs[ranks.rank::ranks.world], "items"
    return itertools.islice(inputs, ranks.rank, None, ranks.world), "items"
