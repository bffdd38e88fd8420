"""The step follower: the part that leads a step's capture when an earlier step's graph is
there to follow (every decoding step after the first; ``capture/seam.py``: ``lead``). Each
op is checked against the op the graph has at its place (function, module call, inputs,
parameters, dtype), and an op that agrees keeps only its time and, where
they differ, its costs (a KV cache grows every step). The first op that departs from the
graph turns the step into a full capture from there on: the ops before it keep the graph's
records, and it and the rest get the records the recorder makes.

The check runs after the forward, over what each op was given and returned (held until the
step ends: ``Follower``), and, once a step was checked op by op, by the flow of the tensors
alone (``_flow``); a graph too large to hold is checked as each op runs.

Following is for metadata-only steps (``save=None``, no edits) whose graph wrote nothing in
place; anything else the recorder records itself (the follower then leads nothing).
"""

from __future__ import annotations

import dataclasses
from itertools import chain, compress, count
from math import prod
from operator import attrgetter, itemgetter, ne
from time import perf_counter_ns
from typing import Any
from weakref import ref as _ref

import torch
from torch.overrides import TorchFunctionMode

from ..capture.cow import WRITERS, written_by
from ..capture.naming import NAMES as _names
from ..capture.naming import func_name
from ..capture.record import field, fields, replaced
from ..capture.recorder import EMPTY, PASSTHROUGH, tensor_outputs
from ..capture.seam import Part
from ..capture.transforms import is_wrapped

Tensor = torch.Tensor
Parameter = torch.nn.Parameter
# shape, out_shapes, nbytes, FLOPs: a step's own where they differ from its graph's
costs = fields("shape", "out_shapes", "nbytes", "flops")
# what an input or output record must agree on with its graph's: kind, slot and producer
_END = fields("func", "parents", "dtype", "kind", "slot")
_EDGES = fields("parents", "params", "buffers", "dtype")
_DTYPE_SHAPE = fields("dtype", "shape")  # what an op must agree on
# a followed step holds its ops' tensors until it ends (and checks them then, together) while
# they came to at most this many bytes in the step before; above, it checks each op as it runs
HOLD_BYTES = 64 << 20
_SEQUENCE_TYPES = frozenset({tuple, list})  # what the recorder looks into for tensors
_CONTAINERS = frozenset({tuple, list, dict})
_UNKNOWN = object()  # a callable ``cow`` has not seen: whether it writes is not known yet
# of a held op: (function, args, kwargs, output, outputs, entry, time)
_FUNC, _ARGS, _KWARGS, _MAIN, _OUTS, _, _ELAPSED = (itemgetter(k) for k in range(7))
_CALL = itemgetter(0, 1)  # of a module frame: (address, pass)
_FACTS = attrgetter("dtype", "shape")
_NOT_FOLLOWED = frozenset({"data", "set_data"})  # calls whose output aliases another's memory


def _bytes(record: tuple) -> int:
    """What a raw record's output takes in memory."""
    return field.nbytes(record) or prod(field.shape(record)) * field.dtype(record).itemsize


def graph_bytes(records: list) -> int:
    """The bytes a graph's ops made (what a step following it holds until it ends)."""
    return sum(_bytes(r) for r in records if field.kind(r) == "op")


def _flow(held: list, mains: list, base: dict, start: int) -> tuple | None:
    """How a step's tensors went from op to op, as plain data (None where a sequence holds a
    container, or a parameter no inventory names is read): for every argument of every op
    (keywords, and the items of a sequence, too), the op that first made it, or the
    parameter, buffer or input it is, or else its type; and the same for what each op
    returned. The recorder's edges are a function of this: two steps of one graph whose flows
    are equal have the same edges (each tensor they hold is alive, so an id names one)."""
    argss = list(map(_ARGS, held))
    kwargss = list(map(_KWARGS, held))
    keyed = list(compress(kwargss, kwargss))  # the keywords of the calls given any
    out_ids = list(map(id, mains))
    first = dict(zip(reversed(out_ids), range(start + len(held) - 1, start - 1, -1)))
    outss = list(map(_OUTS, held))
    extra = [(id(t), i) for i, outs in compress(zip(count(start), outss), outss)
             for t in outs[1:]]
    for key, i in extra:
        if first.setdefault(key, i) > i:
            first[key] = i
    first.update(base)  # a parameter, buffer or input is what it is wherever an op returns it
    get = first.get
    everything = list(chain.from_iterable(argss))
    everything += chain.from_iterable(map(dict.values, keyed))
    kinds = list(map(type, everything))
    seqs = list(compress(everything, map(_SEQUENCE_TYPES.__contains__, kinds)))
    items = list(chain.from_iterable(seqs))
    item_kinds = list(map(type, items))
    signs = list(map(get, map(id, everything), kinds))
    item_signs = list(map(get, map(id, items), item_kinds))
    if Parameter in signs or Parameter in item_signs or not _CONTAINERS.isdisjoint(item_kinds):
        return None
    return (list(map(len, argss)), list(map(bool, kwargss)), list(chain.from_iterable(keyed)),
            list(map(len, keyed)), signs, list(map(len, seqs)), item_signs,
            list(map(get, out_ids)), [get(key) for key, _ in extra])


def _as_called(value: Any) -> Any:
    """``value`` with its lists copied (to the depth the recorder looks for tensors in): what
    a call was given, kept past later appends to a list it read (a DenseNet's features)."""
    kind = type(value)
    if kind is list or kind is tuple:
        return kind(map(_as_called, value))
    if kind is dict:
        return {key: _as_called(item) for key, item in value.items()}
    return value


def followable(records: list) -> bool:
    """Whether a later step may follow this graph: nothing in it wrote in place or aliased
    memory (what a follower does not track)."""
    return not any(field.inplace(rec) or field.func(rec) in _NOT_FOLLOWED for rec in records)


@dataclasses.dataclass
class Followed:
    """What a step that kept to the graph it followed leaves: its own times and the records
    whose costs differ; ``output`` is what the forward returned, ``calls`` its module calls'
    frames (their times), ``structure`` its output's structure (plain values in it too),
    ``held_bytes`` what its ops made when it held them until it ended (else None)."""

    times: list[int]
    changed: dict[int, tuple]
    capture_ns: int
    output: Any = None
    calls: list | None = None
    structure: dict | None = None
    held_bytes: int | None = None


class _Ran:
    """Stands for a call that already ran, so that ``Recorder`` records it as any call: it
    returns the output and carries the function's name."""

    def __init__(self, out: Any, name: str):
        self.out, self.__name__ = out, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.out


class Follower(TorchFunctionMode, Part):
    """The step follower, a part that leads its capture: records a step by following
    ``template`` (the records of a graph an earlier step had), handing what departs from it to
    the recorder.

    ``hold``: each op only keeps what it was called with and returned, until the step ends,
    and the ops are checked against the graph then, together (a check between two ops, where
    the CPU's caches are cold, costs about twice what it costs in one loop after the forward,
    and a step whose tensors flowed as an earlier one's needs no check per op at all); without
    it each op is checked as it runs, and nothing is held (``HOLD_BYTES``).
    ``known``: what the followers of this graph found so far (``_settle``); ``made``: the
    bytes the graph's ops made. ``kept(followed)``: the Trace of a step that kept to the graph
    to its end (``Followed``: its times and the records whose costs differ), which the capture
    returns; ``outcome`` holds the ``Followed`` then (else None)."""

    def __init__(self, template: list, hold: bool = True, known: dict | None = None,
                 made: int = 0, kept: Any = None):
        super().__init__()
        self.template, self.hold, self.made, self.kept = template, hold, made, kept
        self.known = {} if known is None else known
        self.outcome: Followed | None = None
        self.state: Any = None  # the capture's, once it leads

    def lead(self, recorder: Any, session: Any) -> Follower | None:
        """Lead the capture, unless it runs in a pinned block (whose writes the recorder
        guards)."""
        state = session.state
        if state.guard is not None:
            return None
        self.recorder, self.state = recorder, state
        self.start = len(state.records)  # the step's inputs are recorded before the forward
        self.times: list[int] = []
        self.changed: list[int] = []
        self.following = True
        self.departed = False
        self.held: list | None = [] if self.hold else None
        self.entries = dict(state.tensors)  # the inputs' (the held check's own id table)
        self.held_bytes: int | None = None  # known when it held them
        self.flow: tuple | None = None
        return self

    def __torch_function__(self, func, types, args=(), kwargs=None):
        s = self.state
        if func in PASSTHROUGH or s.suspended:
            return func(*args, **kwargs) if kwargs else func(*args)
        if not self.following:
            return self.recorder.__torch_function__(func, types, args, kwargs)
        if (WRITERS.get(func, _UNKNOWN) is not None or kwargs and "out" in kwargs) and \
                written_by(func, args, kwargs or EMPTY):
            # a call that writes: recorded from before it runs, the ops before it checked first
            self.depart()
            return self.recorder.__torch_function__(func, types, args, kwargs)
        t0 = perf_counter_ns()
        try:
            out = func(*args, **kwargs) if kwargs else func(*args)
        except BaseException as exc:
            self.depart()
            self.recorder.note_failure(func, args, kwargs, exc)
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
                return self._replay(func, types, args, kwargs, out, elapsed)
        if is_wrapped(main):  # inside a functorch transform: the recorder's own business
            return self._replay(func, types, args, kwargs, out, elapsed)
        if list in map(type, args):  # a list the forward may add to later: as the call saw it
            args = _as_called(args)
        if kwargs and list in map(type, kwargs.values()):
            kwargs = _as_called(kwargs)
        records = s.records
        index = len(records)
        records.append(s.frames[-1])  # the graph's record stands for it, once checked
        held = self.held
        tensors = s.tensors
        # a held op's version is read if the step departs (nothing writes while it follows)
        if outs is None:
            entry = tensors[id(main)] = (index, _ref(main), 0 if held is not None else
                                         main._version, 0)
        else:
            entry = []
            for position, t in enumerate(outs):
                entry.append((t, (index, _ref(t), 0 if held is not None else t._version,
                                  position)))
                tensors[id(t)] = entry[-1][1]
        if held is not None:
            held.append((func, args, kwargs, main, outs, entry, elapsed))
            return out
        self.times.append(elapsed)  # checked now (it holds nothing)
        self._check_each([(func, args, kwargs, main, outs, entry, elapsed)],
                         [_names.get(func) or func_name(func)], index)
        if not self.following:
            self.depart()
        return out

    def _settle(self) -> None:
        """Check the held ops against the graph, now that they ran: an op that agrees keeps
        the graph's record (its own where its costs differ); from the first that departs on,
        each gets its own record and the step stops following. A step whose calls (functions,
        module calls) are the graph's and whose tensors flowed as they did in a step checked in
        full (``_flow``) has that step's edges: only its dtypes and costs are read."""
        held, self.held = self.held, None
        if held is None:
            return
        s, known, template, start = self.state, self.known, self.template, self.start
        end = start + len(held)
        self.times = list(map(_ELAPSED, held))
        names = list(map(_names.get, map(_FUNC, held)))
        if None in names:
            names = [name or func_name(func) for name, func in zip(names, map(_FUNC, held))]
        if "names" not in known:
            known["names"] = list(map(field.func, template))
            known["calls"] = [_CALL(frame) for frame in map(field.frame, template)]
            known["facts"] = list(map(_DTYPE_SHAPE, template))
            # ops whose costs are read every step: FLOPs from argument shapes, several outputs
            known["costly"] = [i for i, rec in enumerate(template) if field.kind(rec) == "op" and (
                field.out_shapes(rec) is not None or field.flops(rec) is not None and
                type(field.flops(rec)) is not str)]
        base = {key: (name,) for key, name in s.buffer_ids.items()}
        base.update(s.param_ids)
        base.update((key, entry[0]) for key, entry in self.entries.items())
        mains = list(map(_MAIN, held))
        flow = _flow(held, mains, base, start)
        facts = list(map(_FACTS, mains))
        graph = known["facts"][start:end]
        moved = [] if facts == graph else list(compress(count(start), map(ne, facts, graph)))
        if flow is not None and flow == known.get("flow") and \
                names == known["names"][start:end] and \
                list(map(_CALL, s.records[start:end])) == known["calls"][start:end] and \
                all(facts[i - start][0] is known["facts"][i][0] for i in moved):
            # the graph's edges: the shapes that moved, and FLOPs read from shapes, are costs
            self._costs_of(held, names, sorted({*moved, *(
                i for i in known["costly"] if start <= i < end)}))
        else:
            self.held_bytes = self.made + self._check_each(held, names, start)
            self.flow = flow  # the step's, checked in full: the next steps' proof, if it ends well

    def _costs_of(self, held: list, names: list[str], which: list[int]) -> None:
        """The ops ``which`` (record indices; their edges are the graph's) with their own
        costs, where they differ from the graph's."""
        records, start, template = self.state.records, self.start, self.template
        delta = 0
        for i in which:
            _, args, kwargs, main, outs, _, elapsed = held[i - start]
            own = self.recorder.costs(names[i - start], args, kwargs, main, outs)
            want = template[i]
            if own != costs(want):
                shape, out_shapes, nbytes, flops = own
                rec = replaced(want, frame=records[i], shape=shape, dtype=main.dtype,
                                    device=main.device, out_shapes=out_shapes, nbytes=nbytes,
                                    flops=flops, time_ns=elapsed)
                records[i] = rec
                self.changed.append(i)
                delta += _bytes(rec) - _bytes(want)
        self.held_bytes = self.made + delta

    def _check_each(self, held: list, names: list[str], index: int) -> int:
        """Each op of ``held`` (the first at record ``index``) checked in full against the
        graph, in the order they ran: the bytes its records add to the graph's."""
        s, template = self.state, self.template
        records, entries, changed = s.records, self.entries, self.changed
        agreed, delta = self.following, 0
        for (_, args, kwargs, main, outs, entry, elapsed), name in zip(held, names):
            frame = records[index]
            rec = self.recorder.record_ran(entries, name, frame, args, kwargs, main, outs, elapsed)
            if agreed:
                want = template[index] if index < len(template) else None
                called = None if want is None else field.frame(want)
                if want is None or field.func(want) != name or called[0] != frame[0] or \
                        called[1] != frame[1] or _EDGES(rec) != _EDGES(want):
                    agreed = self.following = False
                elif costs(rec) == costs(want):
                    rec = None
                else:
                    changed.append(index)
                    delta += _bytes(rec) - _bytes(want)
            if rec is not None:
                records[index] = rec
            if outs is None:
                entries[id(main)] = entry
            else:
                entries.update((id(t), e) for t, e in entry)
            index += 1
        return delta

    def _replay(self, func, types, args, kwargs, out, elapsed):
        """A call the recorder must record itself, after it ran (a nested tensor, a transform's
        wrapper): the step departs, and the call is recorded as any (with its time)."""
        self.depart()
        ran = _Ran(out, _names.get(func) or func_name(func))
        records = self.state.records
        index = len(records)
        try:
            self.recorder.__torch_function__(ran, types, args, kwargs)
        finally:
            _names.pop(ran, None)
        if len(records) > index:
            rec = records[index]
            records[index] = replaced(rec, time_ns=elapsed)
        return out

    def depart(self) -> None:
        """Stop following: every op followed so far gets its full record."""
        if self.departed:
            return
        self.departed = True
        held = self.held
        self._settle()
        self.following = False
        if held:  # the held ops' outputs with their versions, for the recorder from here on
            tensors = self.state.tensors
            for index, (_, _, _, main, outs, _, _) in enumerate(held, self.start):
                for position, t in enumerate(outs or (main,)):
                    tensors[id(t)] = (index, _ref(t), t._version, position)
        records, template, start = self.state.records, self.template, self.start
        for index in range(start, len(records)):
            frame = records[index]
            if type(frame) is list:
                rec = template[index]
                records[index] = replaced(rec, frame=frame, time_ns=self.times[index - start])

    def end(self, session: Any) -> None:
        """A step that kept to the graph to its end (the same inputs, ops and outputs) leaves
        its times and differing records (``outcome``); otherwise the ops become full
        records."""
        if self.state is None:  # it did not lead: the recorder recorded every call
            return
        records, template = self.state.records, self.template
        failed = session.failed
        if not failed:
            self._settle()
        if self.following and not failed and len(records) == len(template):
            ends = [*range(self.start), *range(self.start + len(self.times), len(records))]
            if all(_END(records[i]) == _END(template[i]) for i in ends):
                changed = {i: records[i] for i in self.changed}
                changed.update((i, records[i]) for i in ends if costs(records[i]) !=
                               costs(template[i]))
                times = [0] * self.start + self.times + [0] * (len(records) - self.start -
                                                               len(self.times))
                if self.flow is not None:
                    self.known["flow"] = self.flow
                self.outcome = Followed(times, changed, session.capture_ns,
                                        held_bytes=self.held_bytes)
                return
        self.depart()

    def trace(self, session: Any) -> Any:
        """The followed step's Trace (``kept``), or None: the one the records make."""
        followed = self.outcome
        if followed is None:
            return None
        followed.output, followed.calls = session.output, session.calls
        followed.structure = session.structure
        return self.kept(followed)
