"""A run of many forwards as one capture: ``run[i]`` one step's Trace, ``run.values(site)``
the site over the steps, ``print(run)`` a table of steps.

Steps whose op graphs are the same (the same ops, in the same module calls, reading the same
inputs) share one structure: the first such step keeps its Trace, a later one keeps only its
saved values, its op times, the shapes that differ (a KV cache grows every step) and its edit
rows, and ``run[i]`` rebuilds its Trace from the shared one. A step's own facts are int
arrays (4-byte where they fit), and a step whose own shapes equal the step's before it shares
that step's record of them: a decoding step costs its values and about 15 bytes an op, not a
copy of the graph (tests/hf/test_step_memory.py).
"""

from __future__ import annotations

import dataclasses
from array import array
from itertools import compress
from operator import ne
from typing import Any

import torch

from ..capabilities import lookup
from ..capture.engine import record_costs
from ..capture.record import fields
from ..edit_log import EditLog
from ..errors import StepError
from ..trace import Trace
from .follow import HOLD_BYTES, costs, followable, graph_bytes

_KEY = fields("func", "params", "buffers", "dtype", "inplace", "is_view", "kind")
_FRAME = fields("frame")
_PARENTS = fields("parents")
_TIME = fields("time_ns")


def signature(records: list) -> tuple[tuple, list]:
    """What two steps must agree on to share a graph: every op's function, parameters,
    buffers, dtype, write in place, view, kind and module call (hashable), and its inputs;
    shapes may differ (they are each step's own)."""
    return ((tuple(map(_KEY, records)), tuple([(f[0], f[1]) for f in map(_FRAME, records)])),
            list(map(_PARENTS, records)))


@dataclasses.dataclass(slots=True)
class Step:
    """One captured step: its index, the structure it shares (``shares``: the step whose
    Trace holds the graph), and what is its own, as compact as it can be kept (a long run
    holds thousands: ``times`` and ``call_times`` are arrays, ``changed`` one packed array)."""

    index: int
    shares: int
    ops: int
    time_ns: int
    trace: Trace | None = None  # kept for the first step of each structure
    values: dict[int, Any] | None = None  # op index -> saved value (a shared step; None: none)
    times: array | None = None  # op times (a shared step)
    meta: dict[str, Any] | None = None  # a shared step's edit rows, when it has any
    capture_ns: int = 0  # a shared step's capture time
    changed: array | None = None  # ``pack``ed costs of the ops whose costs differ
    changed_other: dict[int, tuple] | None = None  # those ``pack`` cannot hold (several outputs)
    call_order: tuple | None = None  # (address, pass) of its module calls (a shared step)
    call_times: array | None = None  # their times, in that order
    structure: dict | None = None  # its output's structure, where it differs from the graph's
    token: int | None = None  # the token a generation step chose (tl.generate)
    saved: int | None = None  # how many values the first step of a graph saved

    def costs(self) -> dict[int, tuple]:
        """Op index -> (shape, out_shapes, nbytes, flops) for the ops whose costs are this
        step's own."""
        found = dict(self.changed_other or {})
        packed, k = self.changed, 0
        while packed is not None and k < len(packed):
            index, ndim = packed[k], packed[k + 1]
            shape = list(packed[k + 2:k + 2 + ndim])
            nbytes, flops = packed[k + 2 + ndim], packed[k + 3 + ndim]
            found[index] = (shape, [shape], nbytes, None if flops < 0 else flops)
            k += 4 + ndim
        return found


def _ints(values: list[int]) -> array:
    """4-byte ints where every one fits (times of ops under 2.1 s), else 8-byte ones."""
    try:
        return array("i", values)
    except OverflowError:
        return array("q", values)


def pack(costs: dict[int, tuple]) -> tuple[array | None, dict[int, tuple] | None]:
    """A step's own costs as one int array (op index, rank, dims, bytes, FLOPs or -1 each)
    and, apart, those of ops with several outputs or no integer FLOPs."""
    packed: list[int] = []
    other = {}
    for index, (shape, out_shapes, nbytes, flops) in costs.items():
        if out_shapes == [shape] and all(type(d) is int for d in shape) and \
                (flops is None or type(flops) is int) and type(nbytes) is int:
            packed.extend((index, len(shape), *shape, nbytes, -1 if flops is None else flops))
        else:
            other[index] = (shape, out_shapes, nbytes, flops)
    return _ints(packed) if packed else None, other or None


class StepRun:
    """The steps of one ``tl.steps`` block (or ``tl.generate``): ``len(run)`` every top-level
    call, ``run.steps`` the captured ones' Traces, ``run[i]`` step ``i``."""

    def __init__(self, model_class: str, selected: Any):
        self.model_class = model_class
        self._selected = selected
        self._steps: dict[int, Step] = {}
        # structure signature -> (the step holding it, its ops' inputs) of each graph with it
        self._shapes: dict[tuple, list[tuple[int, list]]] = {}
        self._records: dict[int, list] = {}  # the raw records of each structure's first step
        self._followable: dict[int, bool] = {}  # structure -> a later step may follow it
        # structure -> the bytes its ops made: in its first step, in its last step
        self._made: dict[int, tuple[int, int]] = {}
        self._known: dict[int, dict] = {}  # structure -> what its followers proved of it
        self._orders: dict[tuple, tuple] = {}  # each order of module calls once
        self._last: int | None = None  # the step captured last
        self._previous: int | None = None  # the one captured before it
        self.count = 0  # top-level calls made in the block, captured or not
        self.skipped_ns = 0  # time of the calls not captured
        self.text: str | None = None  # tl.generate: the generated text
        self.tokens: list[int] | None = None  # tl.generate: the generated token ids
        self.provenance: dict[str, Any] = {}

    # ---- filling -----------------------------------------------------------------------------
    def follow(self) -> tuple[int, list, bool, dict, int] | None:
        """(structure, its records, hold?, what its followers proved of it, its ops' bytes)
        for the next step to follow (``follow.Follower``): the graph of the step captured last,
        when nothing in it wrote in place (``follow.followable``); ``hold`` when its ops made
        at most ``follow.HOLD_BYTES`` in the last step that had it."""
        if self._last is None:
            return None
        first = self._steps[self._last].shares
        records = self._records.get(first)
        if records is None:
            return None
        ok = self._followable.get(first)
        if ok is None:
            ok = self._followable[first] = followable(records)
        if not ok:
            return None
        if first not in self._made:
            self._made[first] = (graph_bytes(records),) * 2
        base, last = self._made[first]
        return first, records, last <= HOLD_BYTES, self._known.setdefault(first, {}), base

    def add_followed(self, index: int, first: int, kept: Any) -> Trace:
        """A step that kept to structure ``first``'s graph (``follow.Followed``); its Trace,
        made when first read."""
        self._previous, self._last = self._last, index
        if kept.held_bytes is not None:
            self._made[first] = (self._made[first][0], kept.held_bytes)
        order, call_times = self._call_times(kept.calls)
        changed, other = self._pack(first, kept.changed)
        self._steps[index] = Step(index, first, len(kept.times), sum(kept.times),
                                  times=_ints(kept.times), capture_ns=kept.capture_ns,
                                  changed=changed, changed_other=other,
                                  call_order=order, call_times=call_times,
                                  structure=self._own(first, kept.structure))
        template = self._steps[first].trace
        step = self._steps[index]
        return Trace.deferred(lambda: _parts(self[index]), step.ops,
                              step.structure or template.output_structure,
                              _step_meta(template, step), provenance=template.provenance)

    def _own(self, first: int, structure: dict) -> dict | None:
        """A step's output structure where it differs from its graph's (a plain value in the
        output that changed: a counter, a flag); None where it is the same."""
        return None if structure == self._steps[first].trace.output_structure else structure

    def _call_times(self, calls: list) -> tuple[tuple, array]:
        """(the order of a step's module calls, their times): a shared step's own."""
        order = tuple([(frame[0], frame[1]) for frame in calls])
        return self._orders.setdefault(order, order), _ints([frame[4] for frame in calls])

    def _pack(self, first: int, records: dict[int, tuple]) -> tuple:
        """The ``pack``ed costs of a shared step's ops whose costs differ from its graph's
        (``records``: their raw records), made now, so no record is kept; the same array as
        the step captured before it where they are equal (a run settled into new shapes)."""
        if not records:
            return None, None
        weights = {name: torch.Size(info["shape"])
                   for name, info in self._steps[first].trace.params.items()}
        changed, other = pack({i: record_costs(rec, weights.get) for i, rec in records.items()})
        before = self._steps.get(self._previous) if self._previous is not None else None
        if before is not None and before.shares == first:
            if before.changed == changed:
                changed = before.changed
            if before.changed_other == other:
                other = before.changed_other
        return changed, other

    def add(self, index: int, trace: Trace, raw: tuple | None) -> None:
        """A captured step (``raw``: its records, kept values and module calls, from its
        ``StepKeeper``): shared with an earlier one when their graphs are the same."""
        self._previous, self._last = self._last, index
        if raw is None:  # nothing raw to share: keep it whole
            self._steps[index] = Step(index, index, len(trace), 0, trace=trace)
            return
        records, values, calls = raw
        key, parents = signature(records)
        times = list(map(_TIME, records))
        total = sum(times)
        candidates = self._shapes.setdefault(key, [])
        first = next((i for i, p in candidates if p == parents), None)
        if first is None:
            candidates.append((index, parents))
            self._steps[index] = Step(index, index, len(records), total, trace=trace,
                                      saved=len(values))
            self._records[index] = records
        else:
            edits = trace.meta.get("edits")
            base = self._records[first]
            changed, other = self._pack(first, {
                i: records[i] for i in compress(range(len(records)), map(
                    ne, map(costs, records), map(costs, base)))})
            order, call_times = self._call_times(calls)
            self._steps[index] = Step(index, first, len(records), total,
                                      values=dict(values) or None, times=_ints(times),
                                      meta={"edits": edits} if edits is not None else None,
                                      capture_ns=trace.meta.get("capture_ns", 0),
                                      changed=changed, changed_other=other,
                                      call_order=order, call_times=call_times,
                                      structure=self._own(first, trace.output_structure))

    # ---- reading -----------------------------------------------------------------------------
    def __len__(self) -> int:
        """How many top-level calls the block made (captured or not)."""
        return self.count

    @property
    def captured(self) -> list[int]:
        """The indices of the steps that were captured, in order."""
        return sorted(self._steps)

    @property
    def steps(self) -> list[Trace]:
        """A Trace per captured step, in order."""
        return [self[i] for i in self.captured]

    def __getitem__(self, index: int) -> Trace:
        if index < 0:
            index += self.count
        step = self._steps.get(index)
        if step is None:
            raise StepError(
                f"step {index} was not captured (this run made {self.count} call(s); "
                f"captured: {self.captured[:8]}{' ...' if len(self.captured) > 8 else ''})",
                code="steps_not_reached" if index >= self.count else "step_not_captured",
                teach=[f"tl.steps(model, at_steps=[{index}])"])
        if step.trace is not None:
            return step.trace
        return _rebuild(self._steps[step.shares].trace, step)

    def shared(self, index: int) -> int:
        """The step whose graph step ``index`` shares (itself for the first of a structure)."""
        return self._steps[index].shares

    @property
    def structures(self) -> int:
        """How many distinct op graphs the captured steps have."""
        return len({s.shares for s in self._steps.values()})

    def values(self, site: str) -> Any:
        """``site``'s saved value at every captured step: stacked when the shapes agree, a
        list otherwise."""
        found = []
        for i in self.captured:
            target = self[i][site]
            holder = target.calls[0] if hasattr(target, "calls") else target
            value = holder.out
            found.append(value[0] if isinstance(value, tuple) else value)
        if found and all(v.shape == found[0].shape for v in found):
            return torch.stack(found)
        return found

    @property
    def edits(self) -> EditLog:
        """Every firing of every edit, with its step and op label (rows as ``trace.edits``'s,
        printed as its table with a step column)."""
        rows, specs = [], []
        for i in self.captured:
            step = self._steps[i]
            meta = step.trace.meta if step.trace is not None else step.meta
            record = (meta or {}).get("edits") or {"fired": []}
            specs = specs or record.get("specs") or []
            for row in record["fired"]:
                if row["label"] is None and row.get("op_index") is not None:
                    ops = self._steps[step.shares].trace.ops  # a shared step's graph is its own
                    row = dict(row, label=ops[row["op_index"]].label)
                rows.append(dict(row, step=i))
        return EditLog(rows, specs)

    def draw(self, *, step: int | None = None, path: Any = None, **dials: Any):
        """``path="gen.html"``: the viewer with a step selector (each distinct graph once,
        per step its op times, shapes and token); a static format draws step ``step`` (default:
        the first captured). Other dials as ``Trace.draw``."""
        return lookup("draw_steps")(self, step=step, path=path, **dials)

    def __str__(self) -> str:
        head = ("step", "ops", "graph", "time (ms)", "saved", "token")
        lines = [head]
        for i in self.captured:
            step = self._steps[i]
            saved = step.saved if step.saved is not None else len(step.values or ()) \
                if step.trace is None else sum(op.saved for op in step.trace.ops)
            graph = "own" if step.shares == i else f"= step {step.shares}"
            lines.append((str(i), str(step.ops), graph, f"{step.time_ns / 1e6:.2f}", str(saved),
                          "" if step.token is None else str(step.token)))
        widths = [max(len(line[k]) for line in lines) for k in range(len(head))]
        title = (f"Steps of {self.model_class}: {self.count} call(s), {len(self._steps)} "
                 f"captured, {self.structures} distinct graph(s)")
        if self.text is not None:
            title += f"; generated: {self.text!r}"
        return "\n".join([title] + ["  ".join(c.ljust(w) for c, w in zip(line, widths))
                                    .rstrip() for line in lines])

    def __repr__(self) -> str:
        return f"<StepRun of {self.model_class}: {self.count} steps, {len(self._steps)} captured>"


def _rebuild(template: Trace, step: Step) -> Trace:
    """Step ``step``'s Trace: the shared graph with its own values, times, shapes and costs
    where they differ, and edit rows."""
    changed = step.costs()
    values = step.values or {}
    ops = []
    for op in template.ops:
        own = {}
        if op.index in changed:
            shape, out_shapes, nbytes, flops = changed[op.index]
            own = {"shape": shape, "out_shapes": out_shapes, "nbytes": nbytes, "flops": flops}
        ops.append(dataclasses.replace(op, time_ns=step.times[op.index],
                                       saved=op.index in values,
                                       _value=values.get(op.index), **own))
    meta = _step_meta(template, step)
    modules = {a: m.copy() for a, m in template.modules.items()}
    own = dict(zip(step.call_order, step.call_times))
    for module in modules.values():
        for call in module.calls:  # each module call's own time (0: this step made no such call)
            call.time_ns = own.get((call.address, call.pass_num), 0)
    structure = template.output_structure if step.structure is None else step.structure
    return Trace(ops, modules, template.params, template.buffers, structure, meta,
                 provenance=template.provenance)


def _step_meta(template: Trace, step: Step) -> dict:
    """A shared step's meta: its graph's, with its own (capture time, edit rows) and index."""
    return {**{k: v for k, v in template.meta.items() if k != "edits"}, **(step.meta or {}),
            "capture_ns": step.capture_ns, "step": step.index}


def _parts(trace: Trace) -> tuple:
    """What a deferred Trace's builder returns: the ops, modules, params and buffers."""
    return trace.ops, trace.modules, trace.params, trace.buffers
