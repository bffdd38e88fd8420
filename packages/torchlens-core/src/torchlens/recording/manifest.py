"""The store's manifest: a versioned JSON record of what is complete, written atomically.

A store is a folder of immutable safetensors shards plus ``manifest.json``. Under torchrun each
rank keeps ``manifest.rank-NNNNN.json`` for its own shards; rank 0 merges them into
``manifest.json`` when every rank is done. A shard exists in a manifest only once it is whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import RecordingError
from ..version import __version__

FORMAT = "torchlens-recording"
VERSION = 1
MANIFEST = "manifest.json"
OVERWRITE_TEACH = "tl.record(model, inputs, save=[...], to=DIR, overwrite=True)  # start afresh"


def rank_manifest(rank: int) -> str:
    return f"manifest.rank-{rank:05d}.json"


def fingerprint(model: nn.Module) -> dict[str, Any]:
    """What identifies the model a store was written by: class, parameter count (a tied weight
    once, offloaded or not), state hash."""
    from ..capture.inventory import inventory
    from ..capture.policy import state_hash

    cls = type(model)
    return {"class": f"{cls.__module__}.{cls.__qualname__}",
            "parameters": sum(p.numel() for _, p in inventory(model).params),
            "state_hash": state_hash(model)}


def header(model: nn.Module, save: list[str], options: dict[str, Any], world_size: int
           ) -> dict[str, Any]:
    """Everything that must match for a run to resume a store."""
    return {"format": FORMAT, "version": VERSION,
            "versions": {"torchlens": __version__, "torch": torch.__version__},
            "model": fingerprint(model), "selection": {"save": list(save)},
            "options": options, "world_size": world_size}


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Plain words for each way ``new`` would write a different store than ``old``."""
    out = []
    for key, name in (("model", "model"), ("selection", "save selection"),
                      ("options", "options"), ("world_size", "number of ranks")):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out.append(f"{name} ({', '.join(f'{k}: {a.get(k)!r} -> {b.get(k)!r}' for k in keys)})")
        else:
            out.append(f"{name} ({a!r} -> {b!r})")
    return out


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, write, tmp: Path | None = None) -> None:
    """``write(tmp)``, fsync, then rename over ``path``: a reader sees old or new, whole.
    ``tmp`` (default: a hidden file beside ``path``) must be on the same file system."""
    tmp = tmp or path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise RecordingError(
            f"could not write {path.name} in {path.parent}: {exc.strerror or exc}; the store "
            "still holds every shard its manifest lists", code="recording_write_failed",
            teach=["free disk space, then run the same tl.record call again to resume",
                   "tl.record(..., to=OTHER_DIR)  # or write elsewhere"]) from exc


def write_json(path: Path, data: dict[str, Any]) -> None:
    text = json.dumps(data, separators=(",", ":"))
    write_atomic(path, lambda tmp: tmp.write_text(text))


def read_json(path: Path) -> dict[str, Any]:
    """A manifest, or ``recording_invalid`` when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecordingError(f"{path} is not a readable recording manifest ({exc})",
                             code="recording_invalid",
                             teach=[OVERWRITE_TEACH, "tl.recording.open(DIR)  # a store folder"]
                             ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise RecordingError(f"{path} is not a TorchLens recording manifest",
                             code="recording_invalid", teach=[OVERWRITE_TEACH])
    if data.get("version", 0) > VERSION:
        raise RecordingError(
            f"{path} was written by a newer TorchLens (format version {data['version']})",
            code="recording_invalid", teach=["pip install -U torchlens-core"])
    return data


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One manifest from the ranks' manifests: every rank's shards, rows added up."""
    parts = sorted(parts, key=lambda p: p["rank"])
    first = parts[0]
    for part in parts[1:]:
        diff = differences(first, part)
        if diff:
            raise RecordingError(
                f"rank {part['rank']} recorded a different store than rank {first['rank']}: "
                f"{'; '.join(diff)}", code="recording_mismatch",
                teach=["build the same model (same seed or checkpoint) on every rank",
                       OVERWRITE_TEACH])
    merged = {k: v for k, v in first.items() if k not in ("rank", "shards", "rows", "items",
                                                          "status", "labels", "provenance")}
    merged["labels"] = next((p["labels"] for p in parts if p.get("labels")), {})
    origins: dict[str, int] = {}
    for p in parts:
        for origin, n in p["provenance"]["origins"].items():
            origins[origin] = origins.get(origin, 0) + n
    merged["provenance"] = {**first["provenance"], "origins": origins}
    merged["ranks"] = [{"rank": p["rank"], "items": p["items"], "rows": p["rows"],
                        "status": p["status"]} for p in parts]
    merged["shards"] = [s for p in parts for s in p["shards"]]
    merged["rows"] = sum(p["rows"] for p in parts)
    merged["status"] = "complete" if len(parts) == first["world_size"] and all(
        p["status"] == "complete" for p in parts) else "partial"
    return merged
