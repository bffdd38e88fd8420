"""Synthetic groups: loop steps and segments for ops that no submodule holds.

A recurrent loop written at the root (``for t in ...: h = tanh(h @ W + x[t] @ U)``) runs
hundreds of ops outside any submodule, so module folding alone cannot keep a drawing small.
``group_stacks`` gives such runs a module-like call of their own, before the call tree is built:

- a *loop*: ``k`` consecutive repetitions of the same item sequence (ops and module calls with
  the same fingerprints), each reading the one before, become calls ``~loopN:1`` … ``~loopN:k``
  (one call per step), which the ordinary fold then draws as one ``Loop ×k``;
- a *segment*: a scope with more than ``segment`` items is cut into consecutive segments
  (``~segN:1``), recursively, so no level of the tree holds more than ``segment`` items.

Synthetic addresses start with ``~`` and never clash with module addresses. Linear in the number
of ops (times a bounded loop period).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from ..sites import name_of

PREFIX = "~"
MAX_PERIOD = 48  # longest loop body (in items) looked for
MIN_LOOP_OPS = 4  # a loop must stand for at least this many ops to be worth a box


@dataclass
class Synthetic:
    """What a synthetic call is: ``kind`` is "loop" or "segment"; ``ops`` its op labels."""

    address: str
    kind: str
    scope: str | None
    ops: list[str]


def is_synthetic(key_or_address: str) -> bool:
    """True for the address or call key of a loop step or segment."""
    return key_or_address.startswith(PREFIX)


def group_stacks(labels: Sequence[str], stacks: Mapping[str, Sequence[str]],
                 prints: Mapping[str, Hashable], parents: Mapping[str, Sequence[str]],
                 types: Mapping[str, str], *, loops: bool, segment: int | None,
                 ) -> tuple[dict[str, tuple[str, ...]], dict[str, Synthetic]]:
    """New module stacks with loop-step and segment calls inserted, and what each one is."""
    scopes: dict[str | None, list[str]] = {}  # scope → item keys (call key or op label)
    seen: set[str] = set()
    ops_of: dict[str, list[str]] = {}
    for label in labels:
        scope: str | None = None
        for key in stacks[label]:
            ops_of.setdefault(key, []).append(label)
            if key not in seen:
                seen.add(key)
                scopes.setdefault(scope, []).append(key)
            scope = key
        scopes.setdefault(scope, []).append(label)
    builder = _Grouper(prints, parents, ops_of, types)
    for scope, items in list(scopes.items()):
        if loops:
            items = builder.loops(scope, items)
        if segment is not None:
            builder.segments(scope, items, segment)
    if not builder.synthetic:
        return {label: tuple(stacks[label]) for label in labels}, {}
    chain = builder.chain
    grouped: dict[str, tuple[str, ...]] = {}
    for label in labels:
        new: list[str] = []
        for key in stacks[label]:
            new.extend(chain.get(key, ()))
            new.append(key)
        new.extend(chain.get(label, ()))
        grouped[label] = tuple(new)
    return grouped, builder.synthetic


class _Grouper:
    def __init__(self, prints: Mapping[str, Hashable], parents: Mapping[str, Sequence[str]],
                 ops_of: Mapping[str, list[str]], types: Mapping[str, str]):
        self.prints, self.parents, self.ops_of, self.types = prints, parents, ops_of, types
        self.synthetic: dict[str, Synthetic] = {}
        self.chain: dict[str, list[str]] = {}  # item → synthetic keys around it, outer first
        self.members: dict[str, list[str]] = {}
        self.count = 0

    def _ops(self, item: str) -> list[str]:
        if item in self.synthetic:
            return self.synthetic[item].ops
        return self.ops_of.get(item) or [item]

    def _leaves(self, item: str) -> list[str]:
        """The real items (op labels, call keys) inside ``item``."""
        if item not in self.synthetic:
            return [item]
        return [leaf for member in self.members[item] for leaf in self._leaves(member)]

    def _print(self, item: str) -> int:
        if item in self.ops_of:  # a call: its module type and its op prints
            kind = self.types.get(name_of(item), "?")
            return hash(("call", kind, tuple(self.prints[op] for op in self.ops_of[item])))
        return hash(self.prints[item])

    def _new(self, kind: str, scope: str | None, passes: int) -> list[str]:
        self.count += 1
        address = f"{PREFIX}{kind}{self.count}"
        keys = [f"{address}:{p}" for p in range(1, passes + 1)]
        for key in keys:
            self.synthetic[key] = Synthetic(address, kind, scope, [])
        return keys

    def _wrap(self, key: str, items: Sequence[str]) -> None:
        self.members[key] = list(items)
        for item in items:
            for leaf in self._leaves(item):
                self.chain.setdefault(leaf, []).insert(0, key)
        ops = self.synthetic[key].ops
        for item in items:
            ops.extend(self._ops(item))

    # ---- loops -------------------------------------------------------------------------------
    def loops(self, scope: str | None, items: list[str]) -> list[str]:
        """Wrap each run of repeated item sequences; return the scope's items afterwards."""
        prints = [self._print(item) for item in items]
        out: list[str] = []
        i, n = 0, len(items)
        while i < n:
            period, steps = self._best_run(prints, i)
            body = items[i:i + period]
            single_call = period == 1 and body[0] in self.ops_of  # module folding's job
            if steps > 1 and not single_call and self._chained(items, i, period, steps) \
                    and sum(len(self._ops(it)) for it in body) * steps >= MIN_LOOP_OPS:
                keys = self._new("loop", scope, steps)
                for s, key in enumerate(keys):
                    self._wrap(key, items[i + s * period:i + (s + 1) * period])
                out.extend(keys)
                i += period * steps
            else:
                out.append(items[i])
                i += 1
        return out

    @staticmethod
    def _best_run(prints: list[int], i: int) -> tuple[int, int]:
        """(period, repetitions) of the longest tandem repeat starting at ``i``."""
        n, best = len(prints), (1, 1)
        for p in range(1, min(MAX_PERIOD, (n - i) // 2) + 1):
            if prints[i + p] != prints[i] or prints[i:i + p] != prints[i + p:i + 2 * p]:
                continue
            k = 2
            while i + (k + 1) * p <= n and prints[i + k * p:i + (k + 1) * p] == prints[i:i + p]:
                k += 1
            if k * p > best[0] * best[1]:
                best = (p, k)
        return best

    def _chained(self, items: list[str], i: int, period: int, steps: int) -> bool:
        """Each step is one connected piece that reads the step before (a loop body, not a
        window cutting across parallel branches)."""
        before: set[str] = set()
        for s in range(steps):
            step_ops = [op for it in items[i + s * period:i + (s + 1) * period]
                        for op in self._ops(it)]
            if s and not any(p in before for op in step_ops for p in self.parents.get(op, ())):
                return False
            if s < 2 and not self._connected(step_ops):
                return False
            before = set(step_ops)
        return True

    def _connected(self, ops: list[str]) -> bool:
        """True when ``ops`` form one piece through the edges among them."""
        root = {op: op for op in ops}

        def find(x: str) -> str:
            while root[x] != x:
                root[x] = root[root[x]]
                x = root[x]
            return x

        for op in ops:
            for parent in self.parents.get(op, ()):
                if parent in root:
                    root[find(parent)] = find(op)
        return len({find(op) for op in ops}) == 1

    # ---- segments ----------------------------------------------------------------------------
    def segments(self, scope: str | None, items: list[str], size: int) -> None:
        """Cut ``items`` into consecutive segments of at most ``size`` drawn items, level above
        level. A run of calls that will fold into one box (same module kind, same ops, or the
        steps of one loop) counts once and is never cut."""
        size = max(size, 2)
        units = self._units(items)
        while len(units) > size:
            per = -(-len(units) // -(-len(units) // size))  # even chunks, each <= size
            grouped: list[list[str]] = []
            for start in range(0, len(units), per):
                part = [item for unit in units[start:start + per] for item in unit]
                if len(units[start:start + per]) == 1:
                    grouped.append(part)
                    continue
                key = self._new("seg", scope, 1)[0]
                self._wrap(key, part)
                grouped.append([key])
            units = grouped

    def _units(self, items: list[str]) -> list[list[str]]:
        units: list[list[str]] = []
        last = None
        for item in items:
            if item in self.synthetic:
                mark = ("synthetic", self.synthetic[item].address)
            elif item in self.ops_of:
                mark = ("call", self._print(item))
            else:
                mark = None
            if mark is not None and mark == last:
                units[-1].append(item)
            else:
                units.append([item])
            last = mark
        return units
