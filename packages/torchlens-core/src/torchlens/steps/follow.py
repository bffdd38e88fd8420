"""A step's recorder when an earlier step's graph is there to follow (every decoding step
after the first): each call is checked against the op the graph has at that place (function,
module call, inputs, parameters, dtype), and a call that agrees keeps only its time and, where
they differ, its costs (a KV cache grows every step). The first call that departs from the
graph turns the step into a full capture from there on: the ops followed so far become full
records, and that call is recorded as the recorder records any.

Following is for metadata-only steps (``save=None``, no edits) whose graph wrote nothing in
place; anything else is captured by ``Recorder`` itself.
"""

from __future__ import annotations

import dataclasses
from operator import itemgetter
from time import perf_counter_ns
from typing import Any
from weakref import ref as _ref

import torch

from ..capture.cow import storage_key, written_by
from ..capture.flops import FORMULAS, WEIGHT_ARG, shapes
from ..capture.naming import NAMES as _names
from ..capture.naming import func_name
from ..capture.recorder import (
    _EMPTY,
    _NONE,
    _PASSTHROUGH,
    _SCALARS,
    R_DTYPE,
    R_FLOPS,
    R_FRAME,
    R_FUNC,
    R_INPLACE,
    R_KIND,
    R_NBYTES,
    R_OUT_SHAPES,
    R_PARENTS,
    R_SHAPE,
    R_SLOT,
    R_TIME,
    R_VIEW,
    Recorder,
    _inputs,
    tensor_outputs,
)
from ..capture.transforms import is_wrapped

Tensor = torch.Tensor
Parameter = torch.nn.Parameter
# shape, out_shapes, nbytes, FLOPs: a step's own where they differ from its graph's
costs = itemgetter(R_SHAPE, R_OUT_SHAPES, R_NBYTES, R_FLOPS)
# what an input or output record must agree on with its graph's: kind, slot and producer
_END = itemgetter(R_FUNC, R_PARENTS, R_DTYPE, R_KIND, R_SLOT)
_NOT_FOLLOWED = frozenset({"data", "set_data"})  # calls whose output aliases another's memory


def followable(records: list) -> bool:
    """Whether a later step may follow this graph: nothing in it wrote in place or aliased
    memory (what a follower does not track)."""
    return not any(rec[R_INPLACE] or rec[0] in _NOT_FOLLOWED for rec in records)


@dataclasses.dataclass
class Followed:
    """What a step that kept to the graph it followed leaves: its own times and the records
    whose costs differ; ``output`` is what the forward returned, ``calls`` its module calls'
    frames (their times), ``structure`` its output's structure (plain values in it too)."""

    times: list[int]
    changed: dict[int, tuple]
    capture_ns: int
    output: Any = None
    calls: list | None = None
    structure: dict | None = None


class _Ran:
    """Stands for a call that already ran, so that ``Recorder`` records it as any call: it
    returns the output and carries the function's name."""

    def __init__(self, out: Any, name: str):
        self.out, self.__name__ = out, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.out


class Follower(Recorder):
    """Records a step by following ``template`` (the records of a graph an earlier step had)."""

    def __init__(self, state: Any, template: list):
        super().__init__(state)
        self.template = template
        self.start = len(state.records)  # the step's inputs are recorded before the forward
        self.times: list[int] = []
        self.changed: list[int] = []
        self.following = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self.following:
            return Recorder.__torch_function__(self, func, types, args, kwargs)
        s = self.state
        if func in _PASSTHROUGH or s.suspended:
            return func(*args, **kwargs) if kwargs else func(*args)
        records = s.records
        index = len(records)
        name = _names.get(func) or func_name(func)
        frame = s.frames[-1]
        want = self.template[index] if index < len(self.template) else None
        same = want is not None and want[0] == name and want[1][0] == frame[0] and \
            want[1][1] == frame[1]
        if (not same or kwargs and "out" in kwargs) and written_by(func, args, kwargs or _EMPTY):
            self.depart()  # a call that writes: recorded from before it runs
            return Recorder.__torch_function__(self, func, types, args, kwargs)
        t0 = perf_counter_ns()
        try:
            out = func(*args, **kwargs) if kwargs else func(*args)
        except BaseException as exc:
            self.depart()
            self._note_failure(func, args, kwargs, exc)
            raise
        elapsed = perf_counter_ns() - t0
        if type(out) is Tensor:
            main, outs = out, None
        else:
            outs = tensor_outputs(func, args[0] if args else None, out)
            if outs is None:
                return out  # not an op (the recorder keeps no record of it either)
            main = outs[0]
            if len(outs) == 1:
                outs = None
            if main.is_nested:
                same = False
        if not same:
            return self._replay(func, types, args, kwargs, out, elapsed, name)
        if main is (args[0] if args else None) and written_by(func, args, kwargs or _EMPTY):
            # the graph's call, told to write in place this time (``inplace=True``)
            return self._replay(func, types, args, kwargs, out, elapsed, name, inplace=True)
        # the inputs, found as the recorder finds them (no write has happened while following)
        tensors, param_ids, buffer_ids = s.tensors, s.param_ids, s.buffer_ids
        inputs = _inputs(args, kwargs) if kwargs else args
        while True:
            parents: list[int] = []
            params = buffers = _NONE
            for t in inputs:
                if type(t) is not Tensor and not isinstance(t, Tensor):
                    if inputs is args and isinstance(t, (tuple, list)) and \
                            not _SCALARS.issuperset(map(type, t)):
                        inputs = _inputs(args, kwargs)
                        break
                    continue
                key = id(t)
                p = param_ids.get(key)
                if p is not None:
                    params = params + (p,)
                    if key not in tensors:
                        continue
                else:
                    if buffer_ids:
                        b = buffer_ids.get(key)
                        if b is not None:
                            buffers = buffers + (b,)
                    if type(t) is not Tensor and isinstance(t, Parameter) and key not in \
                            buffer_ids:  # a parameter the forward made
                        return self._replay(func, types, args, kwargs, out, elapsed, name)
                entry = tensors.get(key)
                if entry is not None and entry[1]() is t:
                    if entry[0] not in parents:
                        parents.append(entry[0])
                elif p is None and key not in buffer_ids and is_wrapped(t):
                    return self._replay(func, types, args, kwargs, out, elapsed, name)
            else:
                break
        if len(parents) == 1:
            parents = parents[0]
        elif not parents and is_wrapped(main):
            return self._replay(func, types, args, kwargs, out, elapsed, name)
        if parents != want[2] or params != want[3] or buffers != want[4] or \
                main.dtype is not want[6]:
            return self._replay(func, types, args, kwargs, out, elapsed, name)
        shape = main.shape
        flops = None
        if name in FORMULAS:
            weight = WEIGHT_ARG.get(name)
            if weight is not None and len(args) > weight[0]:
                flops = param_ids.get(id(args[weight[0]]))
            if flops is None:
                flops = ([a.shape if isinstance(a, Tensor) else a for a in args],
                         shapes(kwargs) if kwargs else kwargs)
        if outs is None:
            out_shapes = nbytes = None
        else:
            out_shapes = [t.shape for t in outs]
            nbytes = sum(t.element_size() * t.numel() for t in outs)
        if shape != want[5] or flops != want[12] or out_shapes != want[8] or nbytes != want[9]:
            # a cost of this step's own: kept as the recorder would record the op
            records.append((name, frame, parents, params, buffers, s.shapes.setdefault(
                shape, shape), main.dtype, main.device, out_shapes, nbytes, False, want[11],
                flops, elapsed, None, "op", None))
            self.changed.append(index)
        else:
            records.append(frame)  # the graph's record stands for it, with this frame
        self.times.append(elapsed)
        if outs is None:
            tensors[id(main)] = (index, _ref(main), main._version, 0)
        else:
            for position, t in enumerate(outs):
                tensors[id(t)] = (index, _ref(t), t._version, position)
        return out

    def _replay(self, func, types, args, kwargs, out, elapsed, name, inplace=False):
        """The call departs from the graph after it ran: record it as the recorder would (its
        time, and a write in place, which the recorder tells by the version before the call)."""
        self.depart()
        ran = _Ran(out, name)
        s = self.state
        records = s.records
        index = len(records)
        try:
            Recorder.__torch_function__(self, ran, types, args, kwargs)
        finally:
            _names.pop(ran, None)
        if len(records) > index:
            rec = records[index]
            rec = rec[:R_TIME] + (elapsed,) + rec[R_TIME + 1:]
            if inplace:
                rec = rec[:R_INPLACE] + (True, False) + rec[R_VIEW + 1:]
                first = args[0]
                s.writes.setdefault(storage_key(first), []).append(
                    (index, first.storage_offset(), tuple(first.shape), first.stride()))
            records[index] = rec
        return out

    def depart(self) -> None:
        """Stop following: every op followed so far gets its full record."""
        if not self.following:
            return
        self.following = False
        records, template, start = self.state.records, self.template, self.start
        for index in range(start, len(records)):
            frame = records[index]
            if type(frame) is list:
                rec = template[index]
                records[index] = rec[:R_FRAME] + (frame,) + rec[R_FRAME + 1:R_TIME] + (
                    self.times[index - start],) + rec[R_TIME + 1:]

    def finish(self, start_ns: int, failed: bool = False) -> Followed | None:
        """A step that kept to the graph to its end (the same inputs, ops and outputs): its
        times and differing records. Otherwise the ops become full records (None)."""
        records, template = self.state.records, self.template
        if self.following and not failed and len(records) == len(template):
            ends = [*range(self.start), *range(self.start + len(self.times), len(records))]
            if all(_END(records[i]) == _END(template[i]) for i in ends):
                changed = {i: records[i] for i in self.changed}
                changed.update((i, records[i]) for i in ends if costs(records[i]) !=
                               costs(template[i]))
                times = [0] * self.start + self.times + [0] * (len(records) - self.start -
                                                               len(self.times))
                return Followed(times, changed, perf_counter_ns() - start_ns)
        self.depart()
        return None

