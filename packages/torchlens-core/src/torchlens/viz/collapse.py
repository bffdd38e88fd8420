"""Collapsing: the module-call tree of a drawing, folds of repeated blocks, and which calls expand.

Everything here is linear in the number of ops (times nesting depth): ``Structure`` is built in
one pass, folds and rolls map ops positionally onto a representative call, and ``auto`` expands
the call tree level by level while the node count stays within the budget.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..sites import split_pass

Item = tuple[str, str]  # ("call", call key) or ("op", op label)


@dataclass
class CallInfo:
    """One module call inside the drawn scope.

    depth: the module's address depth below the scope (``layer1.0`` is 2 in the whole model),
    which is what ``collapse=<int>`` counts; calls of containers that never run (a ModuleList)
    are not in the tree, so a call's parent may be more than one level up.
    """

    key: str
    address: str
    pass_num: int
    type: str
    depth: int
    parent: str | None
    children: list[Item] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    prints: list[Hashable] = field(default_factory=list)

    @property
    def signature(self) -> tuple[str, tuple[Hashable, ...]]:
        """What makes two calls "identical": module type and the sequence of op fingerprints."""
        return self.type, tuple(self.prints)


class Structure:
    """The call tree of ``labels`` in execution order, from each op's (scoped) module stack.

    ``prints`` gives each op a fingerprint (its func, output shape and parameter shapes), so
    calls compare equal only when they run the same ops on the same geometry.
    """

    def __init__(self, labels: Iterable[str], stacks: Mapping[str, Sequence[str]],
                 prints: Mapping[str, Hashable], types: Mapping[str, str],
                 depths: Mapping[str, int] | None = None, base_depth: int = 0):
        self.calls: dict[str, CallInfo] = {}
        self.root: list[Item] = []
        for label in labels:
            stack = stacks[label]
            parent: str | None = None
            for level, key in enumerate(stack, 1):
                call = self.calls.get(key)
                if call is None:
                    address, pass_num = split_pass(key)
                    depth = depths[address] - base_depth if depths else level
                    call = CallInfo(key, address, pass_num or 1, types.get(address, "?"),
                                    depth, parent)
                    self.calls[key] = call
                    self._children(parent).append(("call", key))
                call.ops.append(label)
                call.prints.append(prints[label])
                parent = key
            self._children(parent).append(("op", label))

    def _children(self, key: str | None) -> list[Item]:
        return self.root if key is None else self.calls[key].children

    def child_calls(self, key: str | None) -> list[str]:
        """Keys of the calls directly inside ``key`` (None: the scope itself)."""
        return [name for kind, name in self._children(key) if kind == "call"]


@dataclass
class Remap:
    """Ops and calls that another op or call stands for, after folding and rolling.

    alias: op label → label of the op drawn in its place. count: representative call key → how
    many calls it stands for; kind: "fold" (consecutive identical siblings) or "roll" (passes
    of one module). members: representative key → every call it stands for, in order.
    run_of: op label → (run id, member index), so edges between folded members can be dropped.
    op_count: op label → how many rolled ops outside modules it stands for.
    group_of: aliased op label → the representative call of its fold or roll (none for ops
    rolled outside modules).
    """

    alias: dict[str, str] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    kind: dict[str, str] = field(default_factory=dict)
    members: dict[str, list[str]] = field(default_factory=dict)
    run_of: dict[str, tuple[int, int]] = field(default_factory=dict)
    op_count: dict[str, int] = field(default_factory=dict)
    group_of: dict[str, str] = field(default_factory=dict)  # aliased op → its group's rep call

    def resolve(self, label: str) -> str:
        """The op finally drawn for ``label`` (folds and rolls may chain)."""
        seen = 0
        while label in self.alias and seen < 64:
            label, seen = self.alias[label], seen + 1
        return label

    def _map(self, structure: Structure, member: str, rep: str) -> None:
        for op, rep_op in zip(structure.calls[member].ops, structure.calls[rep].ops):
            self.alias[op] = rep_op
            self.group_of[op] = rep


def fold_repeats(structure: Structure, parents: Mapping[str, Sequence[str]],
                 remap: Remap) -> None:
    """Fold runs of consecutive identical sibling calls where each call reads the previous one."""
    pending: list[str | None] = [None]
    run_id = 0
    while pending:
        key = pending.pop()
        calls = structure.child_calls(key)
        i = 0
        while i < len(calls):
            run = [calls[i]]
            while i + len(run) < len(calls) and _continues(structure, parents, run[-1],
                                                           calls[i + len(run)]):
                run.append(calls[i + len(run)])
            if len(run) > 1:
                run_id += 1
                rep = run[0]
                remap.count[rep], remap.kind[rep], remap.members[rep] = len(run), "fold", run
                for index, member in enumerate(run):
                    for op in structure.calls[member].ops:
                        remap.run_of[op] = (run_id, index)
                    if index:
                        remap._map(structure, member, rep)
            pending.append(run[0])
            i += len(run)


def _continues(structure: Structure, parents: Mapping[str, Sequence[str]], prev: str,
               nxt: str) -> bool:
    a, b = structure.calls[prev], structure.calls[nxt]
    if a.signature != b.signature:
        return False
    produced = set(a.ops)
    return any(p in produced for op in b.ops for p in parents.get(op, ()))


def roll_passes(structure: Structure, remap: Remap, parents: Mapping[str, Sequence[str]],
                prints: Mapping[str, Hashable], stacks: Mapping[str, Sequence[str]]) -> None:
    """Map every later pass of a module onto its first pass with the same op sequence.

    Ops outside any module that repeat with the loop (the ``tanh`` in ``h = tanh(cell(h))``)
    roll too: an op reading a rolled op merges with the earlier op of the same fingerprint that
    reads the same (rolled) parents in the same module calls.
    """
    groups: dict[tuple, list[str]] = {}
    for key, call in structure.calls.items():  # outer calls come first (creation order)
        if call.ops[0] in remap.alias:
            continue  # inside a folded member or a pass already rolled onto another
        group = groups.setdefault((call.address, call.signature), [])
        group.append(key)
        if len(group) > 1:
            remap._map(structure, key, group[0])
    for members in groups.values():
        if len(members) > 1:
            rep = members[0]
            remap.count[rep], remap.kind[rep], remap.members[rep] = len(members), "roll", members
    seen: dict[tuple, str] = {}
    for label, stack in stacks.items():
        if label in remap.alias:
            continue
        mapped = tuple(remap.resolve(p) for p in parents.get(label, ()))
        key = (prints[label], tuple(stack), mapped)
        first = seen.setdefault(key, label)
        if first != label and any(p in remap.alias for p in parents.get(label, ())):
            remap.alias[label] = first
            remap.op_count[first] = remap.op_count.get(first, 1) + 1


def expanded_calls(structure: Structure, collapse: str | int, budget: int) -> set[str]:
    """The calls drawn as clusters (the rest of the calls become one node each)."""
    calls = structure.calls
    if collapse == "none":
        return set(calls)
    if collapse == "modules":
        return {key for key, call in calls.items() if any(k == "call" for k, _ in call.children)}
    if isinstance(collapse, int):
        return {key for key, call in calls.items() if call.depth < collapse}
    return _auto(structure, budget)


def _auto(structure: Structure, budget: int) -> set[str]:
    """Expand whole levels of the call tree, outermost first, while the drawing fits the budget.

    Expanding a call replaces its one node by its direct children, so the node count after a
    level is known before drawing anything. Calls of a single op expand for free (the op node
    then carries the module's name).
    """
    count = len(structure.root)
    expanded: set[str] = set()
    level = structure.child_calls(None)
    while level:
        grow = sum(len(structure.calls[key].children) - 1 for key in level)
        if count + grow > budget:
            free = [key for key in level if len(structure.calls[key].children) == 1]
            expanded.update(free)
            break
        expanded.update(level)
        count += grow
        level = [child for key in level for child in structure.child_calls(key)]
    return expanded
