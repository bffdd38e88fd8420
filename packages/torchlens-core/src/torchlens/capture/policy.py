"""Execution policy of the pinned surfaces: eval + no-grad, forked RNG, restored state, a receipt.

``pinned(model)`` snapshots every module's ``training`` flag, the RNG streams (CPU and CUDA) and
every buffer, hashes the state dict, runs the body in eval + no-grad, then restores and re-hashes.
The receipt says what was pinned and restored and whether the state verifies bit for bit.
``warm_up`` runs one uncaptured forward inside the pinning, so a timed capture after it does not
count one-time setup.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ..errors import StateError
from .inventory import inventory
from .meta import is_meta
from .offload import homes, hooked


@dataclass
class Receipt:
    """What a pinned surface did to the model, and the proof that it undid it."""

    hash_before: str
    hash_after: str
    verified: bool
    pinned: dict[str, Any]
    restored: list[str]
    materialized: dict[str, list[int]] = field(default_factory=dict)
    algorithm: str = "sha256 over (name, shape, dtype, crc32 of bytes) of every param and buffer"
    no_values: int = 0  # meta tensors: shape, dtype and device verified, no bytes to hash
    offloaded: int = 0  # tensors accelerate keeps on cpu/disk between forwards: homes verified

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @property
    def scope(self) -> str:
        """What the verification covered, in words."""
        parts = []
        if self.no_values:
            parts.append(f"structure only: {self.no_values} meta tensors hold no values to hash "
                         "(training flags and every tensor's name, shape, dtype and device "
                         "checked)")
        if self.offloaded:
            parts.append(f"{self.offloaded} offloaded tensors back in their homes (cpu/disk, "
                         "not hashed)")
        return "; ".join(parts) or "bit for bit"

    def __repr__(self) -> str:
        state = "verified" if self.verified else "MISMATCH"
        extra = f", materialized {sorted(self.materialized)}" if self.materialized else ""
        meta = f", {self.no_values} meta tensors without values" if self.no_values else ""
        away = f", {self.offloaded} offloaded tensors home" if self.offloaded else ""
        return f"<Receipt {state}: state {self.hash_after[:12]}{extra}{meta}{away}>"


def state_fingerprints(model: nn.Module, skip: set[str] = frozenset()) -> dict[str, str]:
    """Per parameter and buffer: ``shape|dtype|crc32`` of its bytes (pending lazy ones skipped;
    a meta tensor, which has no bytes, is ``shape|dtype|meta``)."""
    tensors = list(model.named_parameters(remove_duplicate=False))
    tensors += list(model.named_buffers(remove_duplicate=False))
    return {name: f"{tuple(t.shape)}|{t.dtype}|{'meta' if t.is_meta else f'{_crc(t):08x}'}"
            for name, t in tensors if name not in skip and not is_lazy(t)}


def state_hash(model: nn.Module, skip: set[str] = frozenset(),
               fingerprints: dict[str, str] | None = None) -> str:
    """A digest of every parameter's and buffer's bytes (pending lazy tensors are skipped)."""
    prints = fingerprints if fingerprints is not None else state_fingerprints(model, skip)
    digest = hashlib.sha256()
    for name, value in prints.items():
        digest.update(f"{name}|{value}\n".encode())
    return digest.hexdigest()


def _crc(t: torch.Tensor) -> int:
    data = t.detach()
    if data.device.type != "cpu":
        data = data.cpu()
    data = data.contiguous()
    if data.numel() == 0:
        return 0
    # read the bytes in place (torch needs no numpy for this); ``data`` outlives the call
    raw = (ctypes.c_char * (data.numel() * data.element_size())).from_address(data.data_ptr())
    return zlib.crc32(raw)


def pending_lazy(model: nn.Module) -> dict[str, str]:
    """Names of un-materialized lazy parameters and buffers (name -> 'parameter' / 'buffer')."""
    return inventory(model).pending_lazy()


@contextlib.contextmanager
def pinned(model: nn.Module, surface: str, grad: bool = False) -> Iterator[dict[str, Any]]:
    """Run the body in eval + no-grad (grad stays on when ``grad``) with forked RNG; restore and
    verify afterwards.

    Yields a dict that receives ``receipt`` (a Receipt) when the block exits, also on error.
    """
    box: dict[str, Any] = {}
    lazy_before = pending_lazy(model)
    before = state_hash(model)
    offload = hooked(model.modules())
    homes_before = homes(model, offload) if offload else {}
    flags = [(m, m.training) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for _, b in model.named_buffers()
               if not is_lazy(b) and not b.is_meta]
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    devices = list(range(torch.cuda.device_count())) if cuda else []
    error: BaseException | None = None
    try:
        with torch.random.fork_rng(devices=devices), torch.set_grad_enabled(grad):
            model.eval()
            try:
                yield box
            finally:
                for module, flag in flags:
                    module.training = flag
                with torch.no_grad():
                    for live, saved in buffers:
                        if live.shape == saved.shape and not torch.equal(live, saved):
                            live.copy_(saved)
    except BaseException as exc:
        error = exc
        raise
    finally:
        materialized = {
            name: list(t.shape)
            for name, t in list(model.named_parameters()) + list(model.named_buffers())
            if name in lazy_before and not is_lazy(t)
        }
        after = state_hash(model, skip=set(materialized))
        flags_back = all(module.training == flag for module, flag in flags)
        homes_back = (homes(model, offload) if offload else {}) == homes_before
        receipt = Receipt(
            hash_before=before, hash_after=after,
            verified=before == after and flags_back and homes_back,
            pinned={"mode": "eval", "grad": "enabled" if grad else "disabled", "surface": surface,
                    "rng": "forked (cpu" + (", cuda" if devices else "") + ")"},
            restored=["training flags", "rng state", "buffers"],
            materialized=materialized,
            no_values=sum(t.is_meta for n, t in [*model.named_parameters(),
                                                 *model.named_buffers()]
                          if n not in homes_before),
            offloaded=len(homes_before),
        )
        box["receipt"] = receipt
        if not receipt.verified and error is None:
            raise StateError(
                f"{surface}: the model's parameters or buffers differ after the pinned capture "
                f"(state hash {before[:12]} -> {after[:12]}); the forward mutated state that "
                "TorchLens does not restore (e.g. an in-place write to a parameter)",
                code="state_restore_failed",
                teach=["tl.trace(model, x)  # the power surface keeps your modes and reports no "
                       "receipt", "inspect the forward for in-place writes to parameters"],
            )


def warm_up(model: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    """One uncaptured forward under its own RNG fork (the capture then draws the same random
    numbers it would have drawn first), skipped while lazy parameters are pending."""
    lazy = pending_lazy(model)
    if lazy:
        return {"warmup_forwards": 0, "note": f"no warm-up: lazy parameters {sorted(lazy)[:3]} "
                "materialize in the captured forward, so its times include that setup"}
    if is_meta(model):
        return {"warmup_forwards": 0, "note": "no warm-up: a meta model computes no values, so "
                "its times are the cost of tracing shapes"}
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else []):
        model(*args, **kwargs)
    return {"warmup_forwards": 1, "warmup_ms": round((time.perf_counter() - t0) * 1e3, 3),
            "note": "one uncaptured warm-up forward ran first, under the same pinning, so "
                    "one-time setup (first-call kernels, allocator growth) is not timed"}
