"""One rank's writer: buffers rows, writes whole shards atomically, then lists them.

A shard is written by safetensors straight from the staging buffers into this rank's hidden
folder, then renamed into place only when whole and fsynced; the rank's manifest (and, alone,
the store's ``manifest.json``) is rewritten atomically after it. A kill at any moment leaves
the last manifest, which names only whole shards. One shard at a time is written by a
background thread while the next forwards run, so the disk's latency hides behind compute.
Rows are copied into two sets of staging buffers used in turn, so a long recording holds no
scattered small tensors that would fragment the heap under the forward's own allocations.
"""

from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from ..errors import InputError
from ..units import format_shape
from .manifest import (
    MANIFEST,
    OVERWRITE_TEACH,
    RecordingError,
    differences,
    merge,
    rank_manifest,
    read_json,
    write_atomic,
    write_json,
)
from .rows import Rows

SHARDS = "shards"
OFFSETS = "offsets/"  # prefix of a ragged label's per-example offsets inside a shard


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def prepare(folder: Path, head: dict[str, Any], rank: int, overwrite: bool) -> dict | None:
    """Check ``folder`` against ``head``; return this rank's earlier manifest to resume, if any.
    With ``overwrite`` rank 0 clears the folder (the caller holds the other ranks back)."""
    if overwrite:
        if rank == 0 and folder.exists():
            shutil.rmtree(folder)
        return None
    own = folder / rank_manifest(rank)
    old = read_json(own) if own.exists() else None
    merged = folder / MANIFEST
    against = old or (read_json(merged) if merged.exists() else None)
    if against is None:
        if folder.exists() and any(p.name != SHARDS for p in folder.iterdir()):
            raise RecordingError(f"{folder} is a folder with other files, not a recording store",
                                 code="recording_mismatch",
                                 teach=["tl.record(..., to=NEW_DIR)", OVERWRITE_TEACH])
        return None
    diff = differences(against, head)
    if diff:
        raise RecordingError(
            f"{folder} holds a store written with a different {'; '.join(diff)}",
            code="recording_mismatch",
            teach=[OVERWRITE_TEACH, "tl.record(..., to=OTHER_DIR)  # keep the old store"])
    return old


class _Stage:
    """One label's rows of the shard being filled, in a buffer reused from shard to shard."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None
        self.n = 0
        self.lengths: list[torch.Tensor] = []

    def put(self, rows: Rows, capacity: int) -> None:
        """Copy ``rows`` in; a buffer too small grows to ``capacity`` rows (or doubles)."""
        units, k = rows.units, rows.units.shape[0]
        buf = self.buffer
        if buf is None or self.n + k > buf.shape[0]:
            grown = torch.empty((max(capacity, 2 * self.n, self.n + k), *units.shape[1:]),
                                dtype=units.dtype)
            if self.n:
                grown[:self.n].copy_(buf[:self.n])
            self.buffer = buf = grown
        buf[self.n:self.n + k].copy_(units)  # from an accelerator too: nothing is left there
        self.n += k
        if rows.lengths is not None:
            self.lengths.append(rows.lengths.cpu())

    def take(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The filled rows (a view of the buffer) and their offsets when ragged, else None; the
        stage empties."""
        units, offsets = self.buffer[:self.n], None
        if self.lengths:
            lengths = torch.cat(self.lengths).to(torch.int64)
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        self.n, self.lengths = 0, []
        return units, offsets


class ShardWriter:
    """Rows in, shards out, for one rank of a store."""

    def __init__(self, folder: Path, head: dict[str, Any], rank: int, *, interleave: str,
                 shard_bytes: int, resume: dict | None):
        self.folder, self.rank, self.shard_bytes = folder, rank, shard_bytes
        # shards are written here first (safetensors' own temporary file too), so a killed
        # run's leftovers are this rank's alone to clear, never a file another rank is writing
        self.staging = folder / SHARDS / f".writing-r{rank:05d}"
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        self.part = resume or {**head, "rank": rank, "labels": {}, "shards": [], "rows": 0,
                               "items": 0, "interleave": interleave,
                               "provenance": {"origins": {}}}
        self.part["status"] = "recording"
        self.pending: dict[str, _Stage] = {}
        self._spare: dict[str, _Stage] = {}  # the other set, free once its shard is written
        self.pending_rows: list[int] = []
        self.pending_bytes = 0
        self.bytes_written = sum(s.get("bytes", 0) for s in self.part["shards"])
        self.rows_seen = self.part["rows"]
        self._next = (len(self.part["shards"]), self.part["items"])  # next shard, next input
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchlens-shards")
        self._inflight: Future | None = None

    @property
    def items_done(self) -> int:
        return self.part["items"]

    def note_provenance(self, provenance: dict[str, Any], inputs: int) -> None:
        """Count the inputs' origins; keep the resolver's facts (the tokenizer) once."""
        origins = self.part["provenance"]["origins"]
        origin = provenance.get("origin", "gold")
        origins[origin] = origins.get(origin, 0) + inputs
        if "resolver" not in self.part["provenance"] and provenance.get("resolver"):
            facts = provenance["resolver"]
            self.part["provenance"]["resolver"] = {
                k: v for k, v in facts.items() if k in ("plugin", "kind", "tokenizer", "call",
                                                        "processor", "forward_kwargs")}

    def add(self, example: int, values: dict[str, Any], item_rows: list[int]) -> None:
        """One forward's rows: ``item_rows`` per input it covered (a batch of prompts covers
        several); ``example`` is its first input's index among all inputs, for messages."""
        n_rows = sum(item_rows)
        labels = self.part["labels"]
        if not labels:
            labels.update(self._describe(example, values, n_rows))
        self._check(example, values, n_rows, labels)
        size = {key: rows.units.numel() * rows.units.element_size()
                for key, rows in values.items()}
        per_shard = -(-self.shard_bytes // max(1, sum(size.values())))  # forwards a shard takes
        for key, rows in values.items():
            stage = self.pending.setdefault(key, _Stage())
            stage.put(rows, per_shard * rows.units.shape[0])
            self.pending_bytes += size[key]
        self.pending_rows.extend(item_rows)
        self.rows_seen += n_rows
        if self.pending_bytes >= self.shard_bytes:
            self.flush()

    def _describe(self, example: int, values: dict[str, Any], n_rows: int) -> dict[str, Any]:
        out = {}
        for key, rows in values.items():
            if not isinstance(rows, Rows) or rows.units.dim() == 0 or (
                    rows.lengths is None and rows.units.shape[0] != n_rows):
                raise InputError(
                    f"{key!r} is not one tensor with the batch first (input {example} has "
                    f"{n_rows} example(s); the value is {_kind(rows)}), so it cannot be stored "
                    "as rows", code="recording_value_unsupported",
                    teach=["tl.recording.dry_run(model, x, save=[...])  # find an op label "
                           "with the batch first",
                           "tl.record(model, inputs, save=[...])  # without to=, in memory"])
            out[key] = {"shape": list(rows.units.shape[1:]), "dtype": dtype_name(
                rows.units.dtype), "ragged": rows.lengths is not None}
        return out

    def _check(self, example: int, values: dict[str, Any], n_rows: int, labels: dict) -> None:
        problem = None
        if set(values) != set(labels):
            problem = (f"it recorded {sorted(values)} where earlier inputs recorded "
                       f"{sorted(labels)}")
        else:
            for key, rows in values.items():
                want = labels[key]
                if not isinstance(rows, Rows):
                    problem = f"{key!r} is {_kind(rows)}"
                elif list(rows.units.shape[1:]) != want["shape"] or dtype_name(
                        rows.units.dtype) != want["dtype"] or (
                        rows.lengths is not None) != want["ragged"]:
                    problem = (f"{key!r} has rows of shape {format_shape(rows.units.shape[1:])} "
                               f"{dtype_name(rows.units.dtype)}"
                               f"{' per token' if rows.lengths is not None else ''}, earlier "
                               f"{format_shape(want['shape'])} {want['dtype']}"
                               f"{' per token' if want['ragged'] else ''}")
                elif rows.lengths is None and rows.units.shape[0] != n_rows:
                    problem = f"{key!r} has {rows.units.shape[0]} rows for {n_rows} example(s)"
                if problem:
                    break
        if problem:
            self.flush(wait=True)
            raise InputError(
                f"input {example} changed structure: {problem}. The {self.part['rows']} rows "
                "before it are kept in the store", code="recording_input_changed",
                teach=["give every input the same structure (pad or bucket them alike)",
                       "tl.record(model, other_inputs, save=[...], to=OTHER_DIR)"])

    def flush(self, wait: bool = False) -> None:
        """Hand the pending rows to the writing thread as one shard (after the shard before it
        is listed); with ``wait``, return only once everything handed over is listed."""
        if self.pending_rows:
            tensors: dict[str, torch.Tensor] = {}
            for key, stage in self.pending.items():
                tensors[key], offsets = stage.take()
                if offsets is not None:
                    tensors[OFFSETS + key] = offsets
            index, first = self._next
            rows = self.pending_rows
            self._next = (index + 1, first + len(rows))
            self._settle()  # the shard before is written: its buffers fill next
            self.pending, self._spare = self._spare, self.pending
            self.pending_rows, self.pending_bytes = [], 0
            self._inflight = self._pool.submit(self._commit, tensors, index, first, rows)
        if wait:
            self._settle()

    def _settle(self) -> None:
        """Wait for the shard being written; its error (disk full) is raised here."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    def _commit(self, tensors: dict[str, torch.Tensor], index: int, first: int,
                rows: list[int]) -> None:
        """In the writing thread: the shard whole on disk, then listed in the manifests."""
        name = f"r{self.rank:05d}-{index:06d}.safetensors"
        path = self.folder / SHARDS / name
        metadata = {"rank": str(self.rank), "index": str(index)}
        write_atomic(path, lambda tmp: _save(tensors, tmp, metadata), tmp=self.staging / name)
        size = path.stat().st_size
        shard = {"file": f"{SHARDS}/{name}", "rank": self.rank, "index": index,
                 "items": [first, first + len(rows)], "rows": sum(rows), "bytes": size,
                 "item_rows": rows[0] if len(set(rows)) == 1 else rows}
        part = {**self.part, "shards": [*self.part["shards"], shard],
                "items": self.part["items"] + len(rows), "rows": self.part["rows"] + sum(rows)}
        # alone, the readers' manifest first: a shard file is listed there or gone, and a resume
        # (from this rank's manifest) that does not list it yet writes it again
        single = part["world_size"] == 1
        manifest, listing = (MANIFEST, merge([part])) if single else (rank_manifest(self.rank),
                                                                       part)
        try:
            write_json(self.folder / manifest, listing)
        except RecordingError:  # (disk full) no manifest lists the shard: it goes too
            path.unlink(missing_ok=True)
            raise
        self.part = part
        self.bytes_written += size
        if single:
            write_json(self.folder / rank_manifest(self.rank), part)

    def close(self) -> None:
        """Flush what is pending, wait for it, and mark this rank complete."""
        try:
            self.flush(wait=True)
            self.part["status"] = "complete"
            self._write_manifests()
        finally:
            self._stop()

    def abandon(self) -> None:
        """After an error: keep every whole input recorded so far, then stop the thread."""
        try:
            self.flush(wait=True)
        finally:
            self._stop()

    def _stop(self) -> None:
        self._pool.shutdown(wait=True)
        shutil.rmtree(self.staging, ignore_errors=True)

    def _write_manifests(self) -> None:
        write_json(self.folder / rank_manifest(self.rank), self.part)
        if self.part["world_size"] == 1:
            write_json(self.folder / MANIFEST, merge([self.part]))


def _save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write a shard from the tensors' own memory; an I/O error is raised as the OSError it
    wraps (so it becomes ``recording_write_failed``, naming the cause)."""
    try:
        save_file(tensors, path, metadata=metadata)
    except SafetensorError as exc:
        code = re.search(r"os error (\d+)", str(exc))
        if code is None:
            raise OSError(str(exc)) from exc
        raise OSError(int(code[1]), os.strerror(int(code[1]))) from exc


def _kind(value: Any) -> str:
    if isinstance(value, Rows):
        return f"a tensor of shape {format_shape(value.units.shape)}"
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {format_shape(value.shape)}"
    return f"a {type(value).__name__}"
