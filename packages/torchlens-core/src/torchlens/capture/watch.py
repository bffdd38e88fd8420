"""What a pinned block learns of its forwards' in-place writes.

A capture reports the storages its recorder saw written (``note_writes``: through any alias,
``.data`` included). Before a call writes in place, the recorder, or in an uncaptured warm-up
forward ``guarded()``'s mode, hands the targets to ``write_guard()``: each open block copies a
parameter just before its first write, so a write of equal values verifies (the bytes, not the
version counter, decide).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .cow import may_write, storage_key, written_by


class Watch:
    """One pinned block's: the storages a capture saw written, and the parameters' copies."""

    def __init__(self, params: list[tuple[str, int, torch.Tensor]]):
        self.seen: set[int] = set()
        self.names = [(name, key) for name, key, _ in params]  # a tied one under each name
        self.params = {key: t for _, key, t in params}  # storage -> parameter
        self.copies: dict[int, torch.Tensor] = {}  # storage -> the parameter before the write

    def before_write(self, targets: list[torch.Tensor]) -> None:
        for t in targets:
            key = storage_key(t)
            param = self.params.get(key)
            if param is not None and key not in self.copies:
                with torch._C.DisableTorchFunction():
                    self.copies[key] = param.detach().clone()

    def equal_writes(self, same: Callable[[torch.Tensor, torch.Tensor], bool]) -> set[str]:
        """The names of the written parameters that hold their bytes from before the write
        (``same`` compares two tensors' bytes)."""
        equal = {key for key, copy in self.copies.items() if same(self.params[key], copy)}
        return {name for name, key in self.names if key in equal}


_open = threading.local()  # per thread: the watches of the open pinned blocks


def open_watch(params: list[tuple[str, int, torch.Tensor]]) -> Watch:
    """Start watching (name, storage, parameter) on this thread; ``close_watch`` ends it."""
    watch = Watch(params)
    _open.__dict__.setdefault("watches", []).append(watch)
    return watch


def close_watch(watch: Watch) -> None:
    _open.watches.remove(watch)


def note_writes(storages: Iterable[int]) -> None:
    """A capture reports the storages its recorder saw written in place, for every pinned block
    open on this thread."""
    for watch in getattr(_open, "watches", ()):
        watch.seen.update(storages)


def write_guard() -> Any:
    """For a capture or warm-up inside pinned blocks on this thread: the function its recorder
    calls with the tensors a call is about to write (parameters are copied first); else None."""
    watches = getattr(_open, "watches", None)
    if not watches:
        return None
    if len(watches) == 1:
        return watches[0].before_write
    return lambda targets: [watch.before_write(targets) for watch in watches]


class _WriteGuard(TorchFunctionMode):
    """An uncaptured forward's only bookkeeping: parameters copied before an in-place write."""

    def __init__(self, guard: Any):
        super().__init__()
        self.guard = guard

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if may_write(func, kwargs):
            targets = written_by(func, args, kwargs)
            if targets:
                self.guard(targets)
        return func(*args, **kwargs)


def guarded() -> contextlib.AbstractContextManager:
    """Around an uncaptured forward inside pinned blocks: the write guard's mode."""
    guard = write_guard()
    return _WriteGuard(guard) if guard is not None else contextlib.nullcontext()
