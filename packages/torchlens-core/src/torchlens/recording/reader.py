"""Reading a store: ``tl.recording.open(dir)``, values memory-mapped, rows in input order.

Shards are mapped, never read whole: ``rec[label][i:j]`` touches only those rows' pages.
Rows come back in the order of the inputs, whatever the number of ranks that wrote them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from ..errors import InputError
from ..units import format_shape
from .manifest import MANIFEST, RecordingError, merge, read_json
from .writer import OFFSETS

# safetensors' dtype names (its documented header format)
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}
OPEN_TEACH = "tl.recording.open('acts/')  # a folder tl.record(..., to='acts/') wrote"


class Shard:
    """One safetensors file, mapped on first use; tensors are views into the mapping."""

    def __init__(self, path: Path):
        self.path = path
        self._map: torch.Tensor | None = None
        self._entries: dict[str, Any] | None = None

    def _open(self) -> None:
        try:
            size = self.path.stat().st_size
            with self.path.open("rb") as f:
                n = int.from_bytes(f.read(8), "little")
                entries = json.loads(f.read(n))
        except (OSError, ValueError) as exc:
            raise RecordingError(f"shard {self.path} is unreadable ({exc})",
                                 code="recording_invalid", teach=[OPEN_TEACH]) from None
        entries.pop("__metadata__", None)
        self._entries, self._start = entries, 8 + n
        self._map = torch.from_file(str(self.path), shared=False, size=size, dtype=torch.uint8)

    def tensor(self, name: str) -> torch.Tensor:
        if self._map is None:
            self._open()
        entry = self._entries[name]
        begin, end = (self._start + o for o in entry["data_offsets"])
        flat = self._map[begin:end].view(_DTYPES[entry["dtype"]])
        return flat.view(entry["shape"])


class StoredRecording:
    """A recording store: ``rec[label]`` views its rows, ``rec.batches`` streams them."""

    def __init__(self, folder: Path, manifest: dict[str, Any]):
        self.folder, self.manifest = folder, manifest
        self.labels: list[str] = list(manifest["labels"])
        self._shards = [Shard(folder / s["file"]) for s in manifest["shards"]]
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None
        self._views: dict[str, LabelView] = {}

    @property
    def provenance(self) -> dict[str, Any]:
        """Where the inputs came from: origins counted, and the resolver's facts (tokenizer)."""
        return self.manifest["provenance"]

    @property
    def complete(self) -> bool:
        """Whether the run that wrote the store finished (a killed one's rows still read)."""
        return self.manifest["status"] == "complete"

    def __len__(self) -> int:
        return self.manifest["rows"]

    def __contains__(self, label: object) -> bool:
        return label in self.manifest["labels"]

    def __getitem__(self, label: str) -> LabelView:
        if label not in self.manifest["labels"]:
            raise InputError(f"{label!r} is not in this store; it holds {self.labels[:8]}",
                             code="key_not_found",
                             teach=[f"rec[{self.labels[0]!r}]"] if self.labels else [])
        if label not in self._views:
            self._views[label] = LabelView(self, label)
        return self._views[label]

    def __repr__(self) -> str:
        state = "" if self.complete else f", {self.manifest['status']}"
        return (f"<Recording store {str(self.folder)!r}: {len(self.labels)} label(s) over "
                f"{len(self)} row(s){state}>")

    def batches(self, label: str, batch_size: int = 1024, *, shuffle: bool = False,
                seed: int = 0, drop_last: bool = False) -> Iterator[torch.Tensor]:
        """Stream a label's rows (its real tokens, for per-token values) in batches; with
        ``shuffle`` in a permutation drawn from ``seed`` (the same seed, the same order)."""
        view = self[label]
        units = view.tokens() if view.ragged else view
        n = len(units)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) \
            if shuffle else None
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            end = min(start + batch_size, n)
            yield units[order[start:end]] if order is not None else units[start:end]

    def dataset(self, label: str) -> RecordingDataset:
        """A ``torch.utils.data.Dataset`` over a label's rows (its tokens, when per-token)."""
        view = self[label]
        return RecordingDataset(view.tokens() if view.ragged else view)

    # -- where each row lives --------------------------------------------------------------
    def rows_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row in input order: its shard and its position there (built on first use)."""
        if self._table is None:
            self._table = _row_table(self.manifest)
        return self._table

    def shard(self, index: int) -> Shard:
        """Shard ``index`` of the manifest, opened memory-mapped."""
        return self._shards[index]


def _row_table(manifest: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    world = manifest["world_size"]
    by_rows = manifest.get("interleave") == "rows"
    shard_of, local, keys = [], [], []
    rank_rows: dict[int, int] = {}
    for sid, s in enumerate(manifest["shards"]):
        rows, rank = s["rows"], s["rank"]
        shard_of.append(torch.full((rows,), sid, dtype=torch.int32))
        local.append(torch.arange(rows))
        if by_rows:  # a DistributedSampler's split: rank r holds rows r, r + N, ...
            first = rank_rows.get(rank, 0)
            keys.append(torch.arange(first, first + rows) * world + rank)
            rank_rows[rank] = first + rows
        else:  # rank r took inputs r, r + N, ...
            a, b = s["items"]
            per = s["item_rows"]
            counts = torch.tensor(per) if isinstance(per, list) else torch.full((b - a,), per)
            keys.append((torch.arange(a, b) * world + rank).repeat_interleave(counts))
    if not shard_of:
        return torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int64)
    shard_of, local, key = torch.cat(shard_of), torch.cat(local), torch.cat(keys)
    if world > 1:
        order = torch.sort(key, stable=True).indices
        shard_of, local = shard_of[order], local[order]
    return shard_of, local


class _Units:
    """Gather stored units (rows, or tokens of per-token labels) by shard and position."""

    def __init__(self, rec: StoredRecording, label: str):
        self.rec, self.label = rec, label
        meta = rec.manifest["labels"][label]
        self.shape = tuple(meta["shape"])
        self.dtype = getattr(torch, meta["dtype"])

    def gather(self, shard_of: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        out = torch.empty((len(pos), *self.shape), dtype=self.dtype)
        if len(pos) == 0:
            return out
        first, last = int(shard_of[0]), int(shard_of[-1])
        if first == last and int(pos[-1]) - int(pos[0]) == len(pos) - 1 and bool(
                (pos.diff() == 1).all()):  # one contiguous run: a single copy
            return self.rec.shard(first).tensor(self.label)[int(pos[0]):int(pos[-1]) + 1].clone()
        for sid in torch.unique(shard_of).tolist():
            hit = shard_of == sid
            out[hit] = self.rec.shard(sid).tensor(self.label).index_select(0, pos[hit])
        return out


def _indices(index: Any, n: int) -> torch.Tensor:
    if isinstance(index, slice):
        return torch.arange(n)[index]
    if isinstance(index, torch.Tensor):
        idx = index.to(torch.int64).reshape(-1)
    elif isinstance(index, Sequence):
        idx = torch.tensor(list(index), dtype=torch.int64)
    else:
        raise TypeError(f"rows are indexed by an int, a slice or a list of ints, not {index!r}")
    idx = torch.where(idx < 0, idx + n, idx)
    if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise IndexError(f"row index out of range for {n} rows")
    return idx


def _one(i: int, n: int) -> int:
    j = i + n if i < 0 else i
    if not 0 <= j < n:
        raise IndexError(f"row {i} out of range for {n} rows")
    return j


class LabelView(_Units):
    """One label's rows in input order. ``view[i:j]`` reads only those rows; per-token labels
    give each example's real tokens (``view.row(i)``) or every token (``view.tokens()``)."""

    def __init__(self, rec: StoredRecording, label: str):
        super().__init__(rec, label)
        self.ragged: bool = rec.manifest["labels"][label]["ragged"]
        self._spans: tuple[torch.Tensor, torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.rec)

    def __repr__(self) -> str:
        unit = "tokens per row" if self.ragged else "per row"
        return f"<{self.label!r}: {len(self)} rows, {format_shape(self.shape)} {self.dtype} {unit}>"

    def spans(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token labels: each row's first token (within its shard) and token count."""
        if self._spans is None:
            shard_of, local = self.rec.rows_table()
            starts, counts, base = [], [], [0]
            for sid in range(len(self.rec.manifest["shards"])):
                off = self.rec.shard(sid).tensor(OFFSETS + self.label)
                starts.append(off[:-1])
                counts.append(off.diff())
                base.append(base[-1] + len(off) - 1)
            flat = torch.tensor(base[:-1])[shard_of.to(torch.int64)] + local
            self._spans = (torch.cat(starts)[flat], torch.cat(counts)[flat]) if starts else (
                torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        return self._spans

    def row(self, i: int) -> torch.Tensor:
        """One example's value: its row, or its real tokens ``(tokens, *shape)``."""
        i = _one(i, len(self))
        shard_of, local = self.rec.rows_table()
        sid = int(shard_of[i])
        if not self.ragged:
            return self.rec.shard(sid).tensor(self.label)[int(local[i])].clone()
        start, count = (int(t[i]) for t in self.spans())
        return self.rec.shard(sid).tensor(self.label)[start:start + count].clone()

    def __getitem__(self, index: Any) -> torch.Tensor | list[torch.Tensor]:
        """An int gives one row; a slice or index list a stacked tensor (a list of per-example
        tensors for per-token labels)."""
        if isinstance(index, int):
            return self.row(index)
        idx = _indices(index, len(self))
        if self.ragged:
            return [self.row(int(i)) for i in idx]
        shard_of, local = self.rec.rows_table()
        return self.gather(shard_of[idx], local[idx])

    def tokens(self) -> TokenView:
        """Every real token of every example as rows, in input order (per-token labels)."""
        if not self.ragged:
            raise InputError(f"{self.label!r} has one row per example, not per token",
                             code="option_invalid",
                             teach=[f"rec[{self.label!r}][i:j]  # its rows"])
        return TokenView(self)


class TokenView(_Units):
    """A per-token label's tokens as one sequence of rows: what sparse-autoencoder training
    reads. ``tokens[a:b]`` reads only those tokens."""

    def __init__(self, view: LabelView):
        super().__init__(view.rec, view.label)
        self.view = view
        starts, counts = view.spans()
        self._starts = starts
        self._cum = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])

    def __len__(self) -> int:
        return int(self._cum[-1])

    def __repr__(self) -> str:
        shape = format_shape((len(self), *self.shape))
        return f"<{self.label!r} tokens: {shape} {self.dtype}>"

    def __getitem__(self, index: Any) -> torch.Tensor:
        if isinstance(index, int):
            return self[[_one(index, len(self))]][0]
        idx = _indices(index, len(self))
        row = torch.searchsorted(self._cum, idx, right=True) - 1
        shard_of, _ = self.rec.rows_table()
        return self.gather(shard_of[row], self._starts[row] + (idx - self._cum[row]))


class RecordingDataset(Dataset):
    """A map-style Dataset over stored rows (or tokens); batched reads go through one gather."""

    def __init__(self, units: LabelView | TokenView):
        self.units = units

    def __len__(self) -> int:
        return len(self.units)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.units[int(i)]

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        return list(self.units[list(indices)].unbind(0))


def open(path: str | os.PathLike) -> StoredRecording:  # noqa: A001 - the spec's name
    """Open a store written by ``tl.record(..., to=path)``: values stay on disk, mapped."""
    folder = Path(path)
    if not folder.is_dir():
        raise RecordingError(f"{folder} is not a folder", code="recording_invalid",
                             teach=[OPEN_TEACH])
    merged = folder / MANIFEST
    manifest = read_json(merged) if merged.exists() else None
    if manifest is None or manifest["status"] != "complete":
        parts = sorted(folder.glob("manifest.rank-*.json"))
        if parts:
            manifest = merge([read_json(p) for p in parts])
    if manifest is None:
        raise RecordingError(f"{folder} holds no recording manifest", code="recording_invalid",
                             teach=[OPEN_TEACH])
    for s in manifest["shards"]:
        if not (folder / s["file"]).is_file():
            raise RecordingError(f"{folder} lists shard {s['file']}, which is missing",
                                 code="recording_invalid", teach=[OPEN_TEACH])
    return StoredRecording(folder, manifest)
