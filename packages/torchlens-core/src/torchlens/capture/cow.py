"""Copy-on-write for saved activations.

A saved op output is first kept by reference, no copy: the output itself, or a detached alias
of a view or of an output with an autograd graph (a live view holds its base, and torch counts
that as one more reference to the base). It is copied only when it could change: just before a
call that writes into its storage, or at the end of the capture when something other than the
trace can still reach it or its storage (a parameter, a buffer, an input, the model's output or
state). Whatever else stays an alias is then owned by the trace alone; saved views share memory
with the saved value they view.
"""

from __future__ import annotations

import inspect
import sys
from collections import Counter
from typing import Any

import torch
from torch import Tensor

from .naming import func_name
from .transforms import is_wrapped, unwrapped

_SETITEM = Tensor.__setitem__
SET_DATA = Tensor.data.__set__  # a method-wrapper: compare with ==, a new one each access
WRITERS: dict[Any, Any] = {}  # callable -> how it writes (see _writer_of); cached per callable


def storage_key(t: Tensor) -> int:
    """Identity of ``t``'s storage while it is alive: where its data starts, from the tensor's
    own pointer (``untyped_storage()`` would make a Python object that lives as long as the
    storage does, one more for the collector per saved value). A storage with no memory (on
    meta every one starts at address 0) is told by its storage object instead."""
    try:
        start = t.data_ptr() - t.storage_offset() * t.element_size()
    except Exception:
        if is_wrapped(t):  # a functorch transform's wrapper: the memory is its real tensor's
            return storage_key(unwrapped(t)[0])
        start = 0
    if start:
        return start
    try:  # negative: never a data address
        return -t.untyped_storage()._cdata
    except Exception:
        return -1


def _writer_of(func: Any) -> Any:
    """None (writes nothing but ``out=``), "first" (writes its first argument, the ``*_``
    convention), an int (position of an ``inplace`` flag that makes it write its first
    argument), or a tuple of the positions and names a torch.ops schema marks as written."""
    if func is _SETITEM or func == SET_DATA or func_name(func).endswith("_"):
        return "first"  # (``t.data = v`` gives ``t`` new memory: what it held must be copied)
    schema = getattr(func, "_schema", None)
    if schema is not None:
        written = tuple(x for i, a in enumerate(schema.arguments)
                        if a.alias_info is not None and a.alias_info.is_write for x in (i, a.name))
        return written or None
    try:
        params = list(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return None
    return params.index("inplace") if "inplace" in params else None


def may_write(func: Any, kwargs: dict) -> bool:
    """A cheap first test: False means ``written_by`` would find nothing."""
    try:
        how = WRITERS[func]
    except (KeyError, TypeError):
        return True
    return how is not None or "out" in kwargs


def written_by(func: Any, args: tuple, kwargs: dict) -> list[Tensor]:
    """The tensors ``func(*args, **kwargs)`` is about to write into (best known; see module)."""
    try:
        how = WRITERS[func]
    except KeyError:
        how = WRITERS[func] = _writer_of(func)
    except TypeError:  # an unhashable callable
        how = _writer_of(func)
    found: list[Tensor] = []
    if how == "first":
        if args:
            _tensors(args[0], found)
        else:  # passed by keyword (torch.nn.init's functions are called as f(tensor=...))
            for value in kwargs.values():
                _tensors(value, found)
                if found:
                    break
    elif isinstance(how, int):
        flag = args[how] if len(args) > how else kwargs.get("inplace", False)
        if flag and args:
            _tensors(args[0], found)
    elif isinstance(how, tuple):
        for key in how:
            if isinstance(key, int):
                if len(args) > key:
                    _tensors(args[key], found)
            elif key in kwargs:
                _tensors(kwargs[key], found)
    if kwargs and kwargs.get("out") is not None:
        _tensors(kwargs["out"], found)
    return found


def _tensors(value: Any, found: list[Tensor]) -> None:
    if isinstance(value, Tensor):
        found.append(value)
    elif isinstance(value, (tuple, list)):
        found.extend(v for v in value if isinstance(v, Tensor))


def _refs(values: dict[int, Any], index: int) -> int:
    return sys.getrefcount(values[index])


# what ``_refs`` reads for an object only the dict holds (torch counts a C++ holder as one more)
_ONLY_HELD = _refs({0: object()}, 0)


class Held:
    """Saved values kept by reference: storage -> op indices, and each one's version and, for a
    detached alias, its original output (weakly)."""

    def __init__(self, values: dict[int, Any]):
        self.values = values
        # storage -> held op indices; made at the first write (a forward without in-place
        # writes never needs it), kept up to date from then on
        self.by_storage: dict[int, list[int]] | None = None
        # index -> (version, ref, storage, may be a view)
        self.entries: dict[int, tuple[int, Any, int, bool]] = {}
        self.escaped: set[int] = set()  # storages handed out as an array, a storage, DLPack

    def __bool__(self) -> bool:
        return bool(self.entries)

    def keep(self, index: int, t: Tensor, ref: Any, view: bool = True) -> None:
        """Save op ``index``'s output ``t`` by reference (``view``: it may alias a larger
        storage)."""
        key = storage_key(t)
        if view or t.requires_grad:
            self.values[index] = t.detach()
        else:  # the value is the output itself: its reference count says who else holds it
            self.values[index] = t
            ref = None
        self.entries[index] = (t._version, ref, key, view)
        if self.by_storage is not None:
            self.by_storage.setdefault(key, []).append(index)

    def before_write(self, targets: list[Tensor]) -> None:
        """Copy every held value on the storages a call is about to write."""
        if self.by_storage is None:
            self.by_storage = {}
            for index, entry in self.entries.items():
                self.by_storage.setdefault(entry[2], []).append(index)
        for t in targets:
            for index in self.by_storage.pop(storage_key(t), ()):
                self._own(index)

    def escape(self, t: Tensor) -> None:
        """``t``'s memory was handed to what TorchLens cannot follow (``t.numpy()``): copy what
        is held on it now, and at the end what is kept on it later."""
        self.escaped.add(storage_key(t))
        if self.entries:
            self.before_write([t])

    def forget(self, index: int) -> None:
        """Stop holding op ``index``'s value (the capture replaced it with a copy of its own)."""
        if self.entries.pop(index, None) is not None and self.by_storage is not None:
            for indices in self.by_storage.values():
                if index in indices:
                    indices.remove(index)

    def _own(self, index: int) -> None:
        self.entries.pop(index)
        value = self.values[index]
        if type(value) is not Tensor:  # a subclass's own clone keeps its class and metadata
            self.values[index] = value.clone()
            return
        with torch._C.DisableTorchFunction():
            self.values[index] = value.clone()

    def settle(self, protected: set[int]) -> list[int]:
        """At the end of the capture: copy what others can still reach (they hold the output,
        or it shares a ``protected`` storage or that of a view others hold) and a view
        that alone holds a larger storage (the copy keeps only its own elements); drop and
        return what a call TorchLens could not see has written since (its value is lost)."""
        lost = []
        values = self.values
        entries = list(self.entries.items())
        reached = []
        # storages of views others hold: such a view can write all of it, its base's elements too
        held_views = set()
        outputs_reached = False  # some output kept as itself is reached
        for index, (_, ref, key, view) in entries:
            if ref is None:  # the output itself: its reference count (``_refs``, inline)
                alive = sys.getrefcount(values[index]) > _ONLY_HELD
                outputs_reached = outputs_reached or alive
            else:  # a detached alias (every view is one): reached while its output lives
                alive = ref() is not None
                if alive and view:
                    held_views.add(key)
            reached.append(alive)
        if outputs_reached:
            # an op that returns an earlier output as it is (``to``, eval ``dropout``) holds
            # that object under a second index: each index holding it counts once
            times = Counter(id(values[index]) for index, entry in entries if entry[1] is None)
            reached = [alive and (entry[1] is not None or _refs(values, index) >
                                  _ONLY_HELD + times[id(values[index])] - 1)
                       for (index, entry), alive in zip(entries, reached)]
        if held_views or self.escaped:
            protected = protected | held_views | self.escaped
        sharing = None  # storage -> held values on it; counted for the first view that asks
        for (index, (version, _, key, view)), alive in zip(entries, reached):
            value = values[index]
            if value._version != version and value.numel():  # an empty tensor holds nothing
                self.entries.pop(index)
                del values[index]
                lost.append(index)
            elif alive or key in protected:
                self._own(index)
            elif view:
                if sharing is None:
                    sharing = Counter(entry[2] for _, entry in entries)
                if sharing[key] == 1 and \
                        value.untyped_storage().nbytes() > value.numel() * value.element_size():
                    self._own(index)
        self.by_storage = None
        return lost
