"""Execution policy of the pinned surfaces: eval + no-grad, forked RNG, compiled code run eagerly,
restored state, a receipt.

``pinned(model)`` snapshots every module's ``training`` flag and hook tables, the RNG streams (CPU
and CUDA), every buffer, and each parameter and buffer slot's tensor object, storage and version
counter; runs the body in eval + no-grad; then restores and checks them, with the in-place writes
the capture saw (``watch.note_writes``). The receipt says what was pinned and restored, names what
the body changed, and whether the state verifies. Only the bytes the body writes are read (a
parameter is copied just before its first in-place write), so the check costs the same on a 7B
model as on a small one (``Receipt.algorithm`` says what that leaves unseen).
``state_fingerprints``/``state_hash`` digest the bytes themselves (wrapping row and column sums
of each tensor's words, one read of memory): a model fingerprint for stores and baselines.
``warm_up`` runs one uncaptured forward inside the pinning the first time a model is timed on
inputs of one signature, so a timed capture after it does not count one-time setup.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import Parameter
from torch.nn.parameter import is_lazy

from ..compiled import eager
from ..errors import StateError
from .cow import storage_key
from .inventory import Inventory, inventory, module_paths
from .meta import is_meta
from .offload import file_state, homes, sources
from .watch import close_watch, guarded, open_watch


@dataclass
class Receipt:
    """What a pinned surface did to the model, and the proof that it undid it."""

    hash_before: str
    hash_after: str
    verified: bool
    pinned: dict[str, Any]
    restored: list[str]
    materialized: dict[str, list[int]] = field(default_factory=dict)
    algorithm: str = (
        "sha256 over (name, shape, dtype, device, version counter) of every param and buffer. "
        "Verified: each slot still holds the same tensor object on the same storage with the "
        "same version counter (every in-place torch op moves it), no in-place write the capture "
        "saw landed in a parameter's storage (this catches writes through .data, whose alias "
        "has its own counter), every buffer equals its copy byte for byte (and is restored "
        "when written); a parameter written in place counts as changed unless it equals, byte "
        "for byte, the copy taken just before the block's first write to it. Other bytes are "
        "not re-read, so a write no torch op makes (through a numpy view, raw pointers in an "
        "extension) is not seen")
    no_values: int = 0  # meta tensors: shape, dtype and device verified, no bytes to hash
    offloaded: int = 0  # tensors accelerate keeps on cpu/disk between forwards: homes verified
    # how the offloaded tensors were checked: kept in memory (writes watched, version counters
    # compared) and in files (size and modification time compared); their bytes are not read
    offload_memory: int = 0
    offload_files: int = 0
    hashed: int = 0  # resident tensors whose slot, storage and version the state hash covers
    restored_buffers: list[str] = field(default_factory=list)  # the body wrote them; put back
    restored_flags: list[str] = field(default_factory=list)  # modules the body set to training
    restored_requires_grad: list[str] = field(default_factory=list)  # parameters it flipped
    restored_hooks: list[str] = field(default_factory=list)  # modules it (un)registered hooks on
    replaced: list[str] = field(default_factory=list)  # parameters the body swapped for new ones
    changed: list[str] = field(default_factory=list)  # tensors that differ after the restore

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
            parts.append(self._offload_scope())
        return "; ".join(parts) or ("every tensor slot, storage and version counter; writes "
                                    "the capture saw; buffers byte for byte")

    def _offload_scope(self) -> str:
        """What was and was not checked of the offloaded tensors, in words."""
        checked = []
        if self.offload_memory:
            checked.append(f"{self.offload_memory} held in CPU memory by accelerate: no in-place "
                           "write the capture saw landed in them and their version counters did "
                           "not move")
        if self.offload_files:
            checked.append(f"{self.offload_files} in files on disk: each file kept its size "
                           "and modification time")
        rest = self.offloaded - self.offload_memory - self.offload_files
        if rest:
            checked.append(f"{rest} whose home TorchLens cannot see: not checked")
        return (f"{self.offloaded} offloaded tensors are not in the state hash and their bytes "
                "were not read; they are back in their homes, " + "; ".join(checked))

    @property
    def undone(self) -> str:
        """What the body changed that the restore put back, in words ("" when nothing)."""
        parts = []
        if self.restored_buffers:
            parts.append(f"buffers written by the forward {_names(self.restored_buffers)}")
        if self.restored_flags:
            parts.append(f"training flags set by the forward {_names(self.restored_flags)}")
        if self.restored_requires_grad:
            parts.append("requires_grad flags the forward changed on parameters "
                         f"{_names(self.restored_requires_grad)}")
        if self.restored_hooks:
            parts.append("hooks the forward registered or removed on modules "
                         f"{_names(self.restored_hooks)}")
        return "restored " + " and ".join(parts) if parts else ""

    def __repr__(self) -> str:
        state = "verified" if self.verified else "MISMATCH"
        extra = f", materialized {sorted(self.materialized)}" if self.materialized else ""
        meta = f", {self.no_values} meta tensors without values" if self.no_values else ""
        away = f", {self.offloaded} offloaded tensors home" if self.offloaded else ""
        undone = f", {self.undone}" if self.undone else ""
        hashed = f"state {self.hash_after[:12]}" if self.hashed else "no resident tensor hashed"
        return f"<Receipt {state}: {hashed}{extra}{meta}{away}{undone}>"


def _names(names: list[str], most: int = 5) -> str:
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"{names[:most]}{more}"


def state_fingerprints(model: nn.Module, skip: set[str] = frozenset()) -> dict[str, str]:
    """Per parameter and buffer: ``shape|dtype|fingerprint`` of its bytes (see
    ``Receipt.algorithm``; pending lazy ones skipped; a meta tensor, which has no bytes, is
    ``shape|dtype|meta``). A tensor shared under several names is read once."""
    tensors = [(name, t) for name, t in [*model.named_parameters(remove_duplicate=False),
                                         *model.named_buffers(remove_duplicate=False)]
               if name not in skip and not is_lazy(t)]
    digests = _digests([t for _, t in tensors if not t.is_meta])
    return {name: f"{tuple(t.shape)}|{t.dtype}|{'meta' if t.is_meta else digests[id(t)]}"
            for name, t in tensors}


def state_hash(model: nn.Module, skip: set[str] = frozenset(),
               fingerprints: dict[str, str] | None = None) -> str:
    """A digest of every parameter's and buffer's fingerprint (pending lazy tensors skipped)."""
    prints = fingerprints if fingerprints is not None else state_fingerprints(model, skip)
    digest = hashlib.sha256()
    for name, value in prints.items():
        digest.update(f"{name}|{value}\n".encode())
    return digest.hexdigest()


_COLUMNS = 1024  # int64 words a row: the grid whose row and column sums fingerprint a tensor
_BLOCK_ROWS = 128  # rows a CPU block (1 MiB): its column sums read it again while it is in cache


def _digests(tensors: list[torch.Tensor], host: tuple[str, ...] = ("cpu",)) -> dict[int, str]:
    """id -> fingerprint of each tensor. Sums run where the tensor lives; from an accelerator
    (a device type not in ``host``) only the sums and the short tail come back, in one copy per
    device."""
    out: dict[int, str] = {}
    remote: dict[torch.device, list[tuple[int, list[torch.Tensor]]]] = {}
    seen: set[int] = set()
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        on_host = t.device.type in host
        parts = _parts(t, blocked=on_host)
        if on_host:
            out[id(t)] = _blake(parts)
        else:
            remote.setdefault(t.device, []).append((id(t), parts))
    for entries in remote.values():
        sizes = [sum(p.numel() for p in parts) for _, parts in entries]
        flat = torch.cat([p for _, parts in entries for p in parts]).cpu() if any(sizes) \
            else torch.empty(0, dtype=torch.uint8)
        for (key, _), piece in zip(entries, flat.split(sizes)):
            out[key] = _blake([piece])
    return out


def _parts(t: torch.Tensor, blocked: bool) -> list[torch.Tensor]:
    """What a tensor's fingerprint hashes, as uint8 tensors on its device: the row and column
    sums of its whole 1024-word rows, then the bytes after them."""
    raw = _bytes(t)
    rows = raw.numel() // (8 * _COLUMNS)
    if not rows:
        return [raw]
    head = raw[:rows * 8 * _COLUMNS]
    try:
        grid = head.view(torch.int64).view(rows, _COLUMNS)
    except RuntimeError:  # a view whose storage offset is not a whole word
        grid = head.clone().view(torch.int64).view(rows, _COLUMNS)
    row_sums, col_sums = _sums(grid, blocked)
    return [row_sums.view(torch.uint8), col_sums.view(torch.uint8), raw[head.numel():]]


def _sums(grid: torch.Tensor, blocked: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Wrapping int64 row and column sums; on the host block by block, so the column pass reads
    each block from cache, not memory (two reads of memory would cost twice)."""
    n = grid.shape[0]
    if not blocked or n <= _BLOCK_ROWS:
        return grid.sum(1), grid.sum(0)
    rows = torch.empty(n, dtype=torch.int64)
    cols = torch.empty(-(-n // _BLOCK_ROWS), _COLUMNS, dtype=torch.int64)
    for i, start in enumerate(range(0, n, _BLOCK_ROWS)):
        block = grid[start:start + _BLOCK_ROWS]
        torch.sum(block, 1, out=rows[start:start + _BLOCK_ROWS])
        torch.sum(block, 0, out=cols[i])
    return rows, cols.sum(0)


def _blake(parts: list[torch.Tensor]) -> str:
    """blake2b-64 of CPU uint8 tensors' bytes, read in place (no numpy needed)."""
    digest = hashlib.blake2b(digest_size=8)
    for part in parts:
        if part.numel():
            part = part.contiguous()
            digest.update((ctypes.c_char * part.numel()).from_address(part.data_ptr()))
    return digest.hexdigest()


def pending_lazy(model: nn.Module) -> dict[str, str]:
    """Names of un-materialized lazy parameters and buffers (name -> 'parameter' / 'buffer')."""
    return inventory(model).pending_lazy()


def _slots(modules: list[tuple[str, nn.Module]], skip: set[str] | dict[str, str]
           ) -> tuple[list[tuple], list[tuple]]:
    """(name, owning module, attribute, tensor) of every parameter and of every buffer of
    ``modules`` (``module_paths``), shared ones under each name, in one pass; ``skip``: names
    left out."""
    params: list[tuple] = []
    buffers: list[tuple] = []
    for prefix, module in modules:
        dot = prefix + "." if prefix else ""
        for local, t in module._parameters.items():
            if t is not None and (type(t) is Parameter or not is_lazy(t)) and \
                    dot + local not in skip:
                params.append((dot + local, module, local, t))
        if module._buffers:
            for local, t in module._buffers.items():
                if t is not None and not is_lazy(t) and dot + local not in skip:
                    buffers.append((dot + local, module, local, t))
    return params, buffers


# a module's hook tables (torch's fast path checks the first four; the rest are keyed by the
# same handles): a forward that registers hooks, or removes its own, changes the model
_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks",
                "_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
                "_forward_hooks_always_called")


def _has_hooks(attrs: dict) -> bool:
    get = attrs.get
    return bool(get("_forward_hooks") or get("_forward_pre_hooks") or get("_backward_hooks")
                or get("_backward_pre_hooks"))


def _hooks(modules: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module, dict | None]]:
    """(name, module, copies of its hook tables, or None when it has no hooks) of each module."""
    return [(name, m, {t: dict(attrs[t]) for t in _HOOK_TABLES if t in attrs}
             if _has_hooks(attrs := m.__dict__) else None) for name, m in modules]


def _restore_hooks(hooks: list[tuple[str, nn.Module, dict | None]]) -> list[str]:
    """Put each module's hook tables back to their copies; the modules whose tables differed."""
    changed = []
    for name, module, before in hooks:
        attrs = module.__dict__
        if before is None and not _has_hooks(attrs):
            continue
        for t in _HOOK_TABLES:
            table, was = attrs.get(t), (before or {}).get(t, {})
            if table is not None and table.keys() != was.keys():
                table.clear()
                table.update(was)
                if not changed or changed[-1] != name:
                    changed.append(name)
    return changed


def _put_back(module: nn.Module, table: str, local: str, original: torch.Tensor) -> bool:
    """Return ``original`` to its slot if the body swapped it for another object; True if it
    did."""
    slots = getattr(module, table)  # a TorchScript module's is a mapping without ``get``
    if local in slots and slots[local] is original:
        return False
    other = "_buffers" if table == "_parameters" else "_parameters"
    if local not in getattr(module, other) and local not in module._modules:
        slots[local] = original
    return True


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes as a flat uint8 tensor on its device (a copy only if not contiguous; a
    sparse tensor's are those of its dense values; a DTensor's, its own process's part)."""
    data = t.detach()
    if type(data) is not torch.Tensor and hasattr(type(data), "to_local"):
        data = data.to_local()  # a DTensor holds no storage of its own: read its shard
    if data.layout is not torch.strided:
        data = data.to_dense()
    if data.is_quantized:
        data = data.int_repr()
    elif data.is_complex():
        data = data.resolve_conj()
    return data.resolve_neg().contiguous().reshape(-1).view(torch.uint8)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bytes (a NaN equals itself, -0.0 differs from 0.0), unlike ``torch.equal``."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bytes(a), _bytes(b))


# buffers compared in one call at most this many bytes at a time (the call copies them once more);
# larger groups are compared buffer by buffer, in place
_ONE_COMPARE_BYTES = 1 << 24


def _copy_buffers(buffers: list[tuple]) -> list[tuple[list[tuple], list, torch.Tensor, bool]]:
    """The buffers' values before the body, as (slots, shapes, copy, flat): one flat copy per
    dtype and device (one ``cat``, not a clone per buffer), or a clone of a buffer ``cat``
    cannot flatten (not strided, quantized). Meta buffers have no bytes to copy."""
    groups: dict[tuple, list[tuple]] = {}
    copies: list[tuple[list[tuple], list, torch.Tensor, bool]] = []
    with torch.no_grad():
        for slot in buffers:
            b = slot[3]
            if b.is_meta:
                continue
            if b.layout is torch.strided and not b.is_quantized:
                groups.setdefault((b.dtype, b.device), []).append(slot)
            else:
                copies.append(([slot], [b.shape], b.detach().clone(), False))
        for slots in groups.values():
            copies.append((slots, [slot[3].shape for slot in slots], _flat(slots), True))
    return copies


def _flat(slots: list[tuple]) -> torch.Tensor:
    """The values of buffers of one dtype and device, one after another in one tensor."""
    return torch.cat([slot[3].reshape(-1) for slot in slots])


def _unchanged(slots: list[tuple], shapes: list, flat: torch.Tensor) -> bool:
    """Whether a group's buffers still have their shapes, dtype, device and exactly their
    copy's bytes (one comparison for the group)."""
    if any(t.shape != shape or t.dtype != flat.dtype or t.device != flat.device
           for (_, _, _, t), shape in zip(slots, shapes)):
        return False
    return torch.equal(_flat(slots).view(torch.uint8), flat.view(torch.uint8))


def _restore(model: nn.Module, flags: list, hooks: list, params: list, buffers: list,
             copies: list, receipt: dict[str, list[str]]) -> None:
    """Put back training flags, hook tables, swapped-out parameter and buffer objects,
    parameters' ``requires_grad`` (the last item of each of ``params``) and written buffers
    (their values before: ``copies``), naming in ``receipt`` what the body had changed (added
    to what an earlier restore of the same block named)."""
    _name(receipt, "restored_flags", [name or type(model).__name__ for name, module, flag in flags
                                      if module.training])
    _name(receipt, "restored_hooks", [name or type(model).__name__
                                      for name in _restore_hooks(hooks)])
    for _, module, flag in flags:
        if module.training is not flag:  # nn.Module's setattr is slow: only what changed
            module.training = flag
    _name(receipt, "replaced", [name for name, module, local, t, _ in params
                                if _put_back(module, "_parameters", local, t)])
    flipped = [(name, t, wanted) for name, _, _, t, wanted in params
               if t.requires_grad is not wanted]
    for _, t, wanted in flipped:
        t.requires_grad_(wanted)
    _name(receipt, "restored_requires_grad", [name for name, _, _ in flipped])
    restored = {name for name, module, local, t in buffers
                if _put_back(module, "_buffers", local, t)}
    same: set[str] = set()  # buffers that now hold exactly their bytes from before
    with torch.no_grad():
        for slots, shapes, saved, flat in copies:
            if flat and saved.nbytes <= _ONE_COMPARE_BYTES and _unchanged(slots, shapes, saved):
                same.update(slot[0] for slot in slots)
                continue
            pieces = saved.split([shape.numel() for shape in shapes]) if flat else [saved]
            for (name, _, _, live), shape, piece in zip(slots, shapes, pieces):
                piece = piece.view(shape) if flat else piece
                if live.shape != shape:
                    continue
                if not _same_bits(live, piece):
                    live.copy_(piece)
                    restored.add(name)
                same.add(name)
    _name(receipt, "restored_buffers", [slot[0] for slot in buffers if slot[0] in restored])
    _name(receipt, "same_bytes", list(same))


# what ``_restore`` names on the receipt (``same_bytes`` stays inside the block)
_UNDONE = ("restored_flags", "restored_hooks", "replaced", "restored_requires_grad",
           "restored_buffers")


def _name(receipt: dict[str, list[str]], key: str, names: list[str]) -> None:
    receipt[key] = list(dict.fromkeys([*receipt.get(key, ()), *names]))


_locks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its pinned lock
_locks_lock = threading.Lock()


def _lock_of(model: nn.Module) -> threading.RLock:
    with _locks_lock:
        lock = _locks.get(model)
        if lock is None:
            lock = _locks[model] = threading.RLock()
        return lock


def _state(entries: list[tuple]) -> dict[str, tuple]:
    """name -> (tensor object id, storage, shape, dtype, device, version counter)."""
    return {name: (id(t), storage_key(t), tuple(t.shape), t.dtype, t.device, t._version)
            for name, _, _, t, *_ in entries}


def _digest(state: dict[str, tuple]) -> str:
    """sha256 over every tensor's name, shape, dtype, device and version counter (the text of
    each distinct shape, dtype and device made once: most tensors of a model share them)."""
    facts: dict[tuple, str] = {}
    lines = []
    for name, (_, _, shape, dtype, device, version) in sorted(state.items()):
        text = facts.get(key := (shape, dtype, device))
        if text is None:
            text = facts[key] = f"|{shape}|{dtype}|{device}|"
        lines.append(f"{name}{text}{version}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest()


@contextlib.contextmanager
def pinned(model: nn.Module, surface: str, grad: bool = False,
           inv: Inventory | None = None) -> Iterator[dict[str, Any]]:
    """Run the body in eval + no-grad (grad stays on when ``grad``) with forked RNG and compiled
    code run eagerly (a warm-up or probe forward compiles nothing); restore and verify afterwards.

    Yields a dict that receives ``receipt`` (a Receipt) when the block exits, also on error.
    Buffers the body writes or swaps, flags it sets and module hooks it registers or removes are
    put back and named on the receipt; a parameter it writes (its version counter moved, or a
    capture saw a write land in its storage) or swaps for a new object fails the check
    (``state_restore_failed``, naming it), a swapped one after its original object is put back; a
    parameter written with equal values verifies (``watch.Watch``). No other tensor's bytes are
    read: the cost does not grow with the model's size beyond the buffers' copies. ``inv``: the
    model's inventory, when the caller just took it. Pinned blocks on one model from several
    threads run one at a time: each restores what it found, so overlapping ones would restore each
    other's changes.
    """
    with _lock_of(model), _pinned(model, surface, grad, inv) as box:
        yield box


def _eval(model: nn.Module) -> None:
    """Eval mode. A module that refuses ``eval()`` (``torch.export``'s: its graph's mode was
    fixed when it was exported) gets its flags set directly, all there is to set."""
    try:
        model.eval()
    except NotImplementedError:
        for module in model.modules():
            module.training = False


@contextlib.contextmanager
def _pinned(model: nn.Module, surface: str, grad: bool = False,
           inv: Inventory | None = None) -> Iterator[dict[str, Any]]:
    """The body of ``pinned``, under the model's lock."""
    box: dict[str, Any] = {}
    inv = inv or inventory(model)
    lazy_before = inv.pending_lazy()
    modules = inv.paths
    offload = inv.hooked
    homes_before = homes(model, offload) if offload else {}
    held, files = sources(model, offload) if offload else ([], [])
    held_versions = {name: t._version for name, t in held}
    files_before = {name: file_state(path) for name, path in files}
    skip = {**lazy_before, **homes_before}
    flags = [(name, m, m.training) for name, m in modules]
    hooks = _hooks(inv.modules)
    params, buffer_slots = _slots(modules, skip)
    params = [(*slot, slot[3].requires_grad) for slot in params]
    copies = _copy_buffers(buffer_slots)
    state_before = _state(params + buffer_slots)
    watch = open_watch([(name, key, t) for name, _, _, t, _ in params
                        if (key := state_before[name][1]) > 0]
                       + [(name, storage_key(t), t) for name, t in held])
    undone: dict[str, list[str]] = {}
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    devices = list(range(torch.cuda.device_count())) if cuda else []
    error: BaseException | None = None

    def reset() -> None:
        """Undo what an uncaptured forward of the block did (a warm-up), so the capture after
        it sees the state the caller left; what it undid still goes on the receipt."""
        _restore(model, flags, hooks, params, buffer_slots, copies, undone)
        if any(flag for _, _, flag in flags):
            _eval(model)

    box["reset"] = reset
    try:
        with torch.random.fork_rng(devices=devices), torch.set_grad_enabled(grad), eager():
            if any(flag for _, _, flag in flags):
                _eval(model)
            try:
                yield box
            finally:
                close_watch(watch)
                _restore(model, flags, hooks, params, buffer_slots, copies, undone)
    except BaseException as exc:
        error = exc
        raise
    finally:
        params_after, buffers_after = _slots(module_paths(model), homes_before)
        slots_after = params_after + buffers_after
        materialized = {name: list(t.shape) for name, _, _, t in slots_after
                        if name in lazy_before}
        state_after = _state([slot for slot in slots_after if slot[0] not in materialized])
        # a buffer holding its bytes from before is unchanged whatever its version counter says
        # (an in-place write of equal values, or the restore's own copy), if it is still the same
        # tensor of the same shape, dtype and device
        same = set(undone.get("same_bytes", [])) | watch.equal_writes(_same_bits)
        for name in same & state_after.keys() & state_before.keys():
            if state_after[name][:5] == state_before[name][:5]:
                state_after[name] = state_before[name]
        # each name of a tied tensor; meta and empty tensors have no storage of their own
        written = {name for name, (_, key, *_) in state_before.items()
                   if key > 0 and key in watch.seen} - same
        changed = sorted(written | {
            name for name in {*state_before, *state_after} - set(materialized)
            if state_before.get(name) != state_after.get(name)} | _offload_changed(
            held, held_versions, files, files_before, watch, same))
        flags_back = all(module.training == flag for _, module, flag in flags)
        homes_back = (homes(model, offload) if offload else {}) == homes_before
        receipt = Receipt(
            hash_before=(digest := _digest(state_before)),
            hash_after=digest if state_after == state_before else _digest(state_after),
            verified=not changed and flags_back and homes_back and not undone.get("replaced"),
            pinned={"mode": "eval", "grad": "enabled" if grad else "disabled", "surface": surface,
                    "rng": "forked (cpu" + (", cuda" if devices else "") + ")"},
            restored=["training flags", "rng state", "buffers", "hooks"],
            materialized=materialized,
            no_values=len({id(t) for _, _, _, t in slots_after if t.is_meta}),
            offloaded=len(homes_before), offload_memory=len(held), offload_files=len(files),
            hashed=len(state_before), changed=changed,
            **{key: undone.get(key, []) for key in _UNDONE},
        )
        box["receipt"] = receipt
        if not receipt.verified and error is None:
            raise StateError(_mismatch(surface, receipt), code="state_restore_failed",
                             teach=["tl.trace(model, x)  # the power surface keeps your modes "
                                    "and reports no receipt",
                                    "inspect the forward for in-place writes to parameters or "
                                    "parameters assigned anew"])


def _offload_changed(held: list, versions: dict, files: list, before: dict, watch: Any,
                     same: set[str]) -> set[str]:
    """The offloaded tensors a forward changed at home: one held in memory that a write the
    capture saw landed in (unless it kept its bytes) or whose version counter moved, one whose
    file changed size or modification time."""
    changed = {name for name, t in held if name not in same and (
        storage_key(t) in watch.seen or t._version != versions[name])}
    return changed | {name for name, path in files if file_state(path) != before[name]}


def _mismatch(surface: str, r: Receipt) -> str:
    """The state_restore_failed message: what differs, by name."""
    what = []
    if r.replaced:
        what.append(f"it replaced parameters {_names(r.replaced)} with new tensor objects "
                    "(the originals are put back)")
    if r.changed:
        how = (f"state hash {r.hash_before[:12]} -> {r.hash_after[:12]}"
               if r.hash_before != r.hash_after else
               "an in-place write the capture saw landed in their storage, through an alias "
               "with a version counter of its own such as .data, or in the copy accelerate "
               "keeps of an offloaded weight, or an offloaded weight's file changed")
        what.append(f"tensors {_names(r.changed)} differ after the restore ({how}): the forward "
                    "mutated state that TorchLens does not restore (e.g. an in-place write to a "
                    "parameter)")
    if not what:
        what.append("training flags or offloaded tensors' homes did not come back")
    return f"{surface}: the model's state differs after the pinned capture: " + "; ".join(what)


_warmed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> input signatures


def _signature(args: tuple, kwargs: dict) -> tuple:
    """The inputs' shapes, dtypes and devices: what first-call setup (kernel choice, allocator
    growth) depends on."""
    return tuple((k, tuple(v.shape), v.dtype, v.device) if isinstance(v, torch.Tensor)
                 else (k, type(v).__name__) for k, v in [*enumerate(args), *kwargs.items()])


def warm_up(model: nn.Module, args: tuple, kwargs: dict,
            inv: Inventory | None = None) -> dict[str, Any]:
    """One uncaptured forward under its own RNG fork (the capture then draws the same random
    numbers it would have drawn first), the first time this process captures ``model`` on
    inputs of this signature; skipped while lazy parameters are pending."""
    inv = inv or inventory(model)
    lazy = inv.pending_lazy()
    if lazy:
        return {"warmup_forwards": 0, "note": f"no warm-up: lazy parameters {sorted(lazy)[:3]} "
                "materialize in the captured forward, so its times include that setup"}
    if inv.has_meta and is_meta(model):
        return {"warmup_forwards": 0, "note": "no warm-up: a meta model computes no values, so "
                "its times are the cost of tracing shapes"}
    signature = _signature(args, kwargs)
    seen = _warmed.setdefault(model, set())
    if signature in seen:
        return {"warmup_forwards": 0, "warm": True,
                "note": "measured after this process already ran this model on inputs of this "
                        "shape (one-time setup excluded; no warm-up forward needed)"}
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else []):
        with guarded():
            model(*args, **kwargs)
    seen.add(signature)
    return {"warmup_forwards": 1, "warmup_ms": round((time.perf_counter() - t0) * 1e3, 3),
            "note": "one uncaptured warm-up forward ran first, under the same pinning, so "
                    "one-time setup (first-call kernels, allocator growth) is not timed"}
