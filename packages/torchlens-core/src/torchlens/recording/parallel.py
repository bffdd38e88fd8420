"""tl.record on a model sharded across processes (DTensor tensor parallel, FSDP2) under torchrun.

- Split by tensor: every rank runs every input (the forward needs all of them), each selected
  value is made whole by the sharded gather (``sharded.join``), and rank 0 alone writes: one
  store, as the unsharded model would have written it.
- Split by data (FSDP2 on a one-dimensional mesh): each rank records its own share, as a
  torchrun recording does, but the ranks' forwards run in lockstep, since each all-gathers
  parameters with the others: a rank whose share ran out runs an input again, unwritten.

Each forward is a full capture (the gather follows each value's shard through the op records),
its selected values handed to the same keeper a light capture's taps call.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from ..anatomy import bind_request
from ..capture.engine import capture
from ..capture.inventory import inventory
from ..capture.seam import CaptureRequest
from ..errors import InputError
from ..sharded import join, sharding
from ..sites import split_pass, transformer_name
from .distributed import Ranks
from .manifest import RecordingError

UNSUPPORTED_TEACH = ["tl.trace(model, x, save=[...])  # on every rank, an input at a time: "
                     "whole values (the 'Models across processes' guide)",
                     "tl.record(unsharded_model, inputs, save=[...], to=DIR)  # the model "
                     "before parallelize_module / fully_shard"]


_SPLIT = {"tensor": "by tensor", "data": "by data", "both": "by tensor and by data"}


def how_split(model: nn.Module, *, compiling: bool, generate: bool, names: bool,
              presplit: bool) -> str | None:
    """How ``model``'s recording is shared (``"tensor"``, ``"data"`` or None for a model in
    one process); what a sharded recording cannot do yet refuses here, before any forward."""
    kind = sharding(model)
    if kind is None:
        return None
    what = ("FSDP2 over a mesh of several dimensions (tensor and data parallel together)"
            if kind == "both" else "compile=" if compiling else "generate=" if generate
            else "transformer names in save= or edits= (split by data, each rank would bind "
            "them to its own input)" if names and kind == "data" else
            "a DataLoader with a DistributedSampler (each rank its own batches)"
            if presplit and kind == "tensor" else None)
    if what is not None:
        raise InputError(
            f"tl.record of {type(model).__name__}, sharded across processes "
            f"({_SPLIT[kind]}), does not support {what} "
            "yet" + ("; a tensor-parallel forward needs the same inputs on every rank"
                     if presplit else ""),
            code="record_sharded_unsupported", teach=UNSUPPORTED_TEACH)
    return kind


def capture_whole(model: nn.Module, res: Any, save: list[str], keep: Any, plan: Any,
                  kind: str) -> dict[str, Any]:
    """One forward of a sharded model: the selected values whole, as ``keep`` makes them, under
    the keys a light capture gives (``label``, ``address`` or ``address:pass``, a transformer
    name), in the order the forward made them."""
    inv = res.inventory or inventory(model)
    anchored, _, names = bind_request(model, res.args, res.kwargs, inv, save, None)
    parts = join(model, [p for p in (plan, names) if p is not None],
                 same_inputs=kind == "tensor")
    with torch.no_grad():
        trace = capture(CaptureRequest(model, res.args, res.kwargs, save=anchored,
                                       inventory=res.inventory), parts)
    values = site_values(trace, [s for s in save if transformer_name(s) is None], keep)
    for bound in names.bound if names is not None else ():
        values[bound.name] = keep(bound.name, trace[bound.name].out)
    return values


def site_values(trace: Any, save: list[str], keep: Any) -> dict[str, Any]:
    """``save``'s values in ``trace``, in the order the forward made them."""
    wanted = set(save)
    found: list[tuple[int, str, Any]] = []
    for op in trace.ops:
        if op.saved and (op.label in wanted or split_pass(op.label)[0] in wanted):
            found.append((op.index, op.label, op.out))
    for address in wanted - {key for _, key, _ in found}:
        module = trace.modules.get(address)
        if module is None:
            continue
        for call in module.calls:
            key = address if call.pass_num == 1 else f"{address}:{call.pass_num}"
            last = max((trace[label].index for label in call.output_ops), default=-1)
            found.append((last, key, call.out))
    found.sort(key=lambda item: item[0])
    return {key: keep(key, value) for _, key, value in found}


def fingerprint(model: nn.Module, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` (the manifest's model fingerprint) with a state hash the same on every rank:
    each rank's hash of its own parts (``state_hash`` reads a DTensor's local part), hashed
    together in rank order."""
    import torch.distributed as dist

    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, base["state_hash"])
    return {**base, "state_hash": hashlib.sha256("\n".join(everyone).encode()).hexdigest(),
            "sharded": {"world_size": len(everyone)}}


def lockstep(forwards: Iterable[tuple[int, Any, int]], ranks: Ranks
             ) -> Iterator[tuple[int, Any, int, bool]]:
    """``forwards`` with a flag whether to write it, padded so that every rank runs as many
    forwards as the rank with most: a rank whose share ran out runs its last input again (or
    another rank's, when it had none), unwritten."""
    import torch.distributed as dist

    it = iter(forwards)
    last = None
    while True:
        step = next(it, None)
        flags: list = [None] * ranks.world
        dist.all_gather_object(flags, (step is not None, step is not None or last is not None))
        if not any(have for have, _ in flags):
            return
        offered: list = [None] * ranks.world
        if not all(known for _, known in flags):  # a rank with no input at all borrows one
            mine = step or last
            dist.all_gather_object(offered, None if mine is None else mine[1])
        if step is not None:
            last = step
            yield (*step, True)
            continue
        if last is None:
            last = (0, next(v for v in offered if v is not None), 1)
        yield (*last, False)


class Bystander:
    """The writer of a rank that runs every forward of a tensor-parallel recording but writes
    nothing (rank 0 writes): it skips the inputs rank 0's store already holds."""

    def __init__(self, items_done: int):
        self.items_done, self.rows_seen, self.bytes_written = items_done, 0, 0
        self.part: dict[str, Any] = {}

    def note_provenance(self, provenance: Any, count: int) -> None:
        pass

    def add(self, k: int, values: dict[str, Any], rows: list[int]) -> None:
        self.rows_seen += sum(rows)

    def close(self) -> None:
        pass

    def abandon(self) -> None:
        pass


def on_rank_0(ranks: Ranks, open_writer: Any) -> Any:
    """Rank 0's ``open_writer()``, the others a ``Bystander`` that skips as many inputs; a
    failure on rank 0 (a store of another model, a folder it cannot write) is raised on every
    rank (the others as a ``RecordingError`` with its code), not left waiting."""
    import torch.distributed as dist

    writer, outcome = None, [None]
    if ranks.rank == 0:
        try:
            writer = open_writer()
            outcome = [("ok", writer.items_done)]
        except Exception as exc:  # a refusal, or a folder it cannot write: the others wait
            outcome = [("refused", getattr(exc, "code", "recording_invalid"), str(exc),
                        list(getattr(exc, "teach", None) or []))]
            dist.broadcast_object_list(outcome, src=0)
            raise
    dist.broadcast_object_list(outcome, src=0)
    if ranks.rank == 0:
        return writer
    if outcome[0][0] == "refused":
        _, code, message, teach = outcome[0]
        raise RecordingError(f"{message} (on rank 0)", code=code, teach=teach)
    return Bystander(outcome[0][1])


__all__ = ["how_split", "capture_whole", "fingerprint", "lockstep", "on_rank_0", "Bystander"]
