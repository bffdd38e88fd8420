"""The interactive view model: every call, fold and op of a drawing, for renderers that lay the
graph out and toggle it themselves (the html renderer of torchlens-viz).

It is the same view model the static drawing uses (``_Builder.prepare``: scope, loop steps and
segments, folds, rolls; the node titles and lines), kept whole instead of cut at one collapse
state: which calls start expanded (the ``collapse=`` asked for), which folds start folded, and
what each node shows are decided here. A page only lays out, toggles and paints.

``PageModel.data`` is plain JSON (schema ``PAGE_SCHEMA``). Ops are stored by column to keep the
file small; ``calls[i].items`` lists a call's children in order, an op as its index ``>= 0``
and a call ``c`` as ``-(c + 1)``. ``attention`` holds the trace's saved attention patterns for
the page's attention panel (``torchlens.viz.attention.page_patterns``), or None.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..sites import split_pass
from ..units import format_shape
from .attention import page_names, page_patterns
from .build import _Builder, shorten
from .collapse import expanded_calls
from .groups import is_synthetic
from .metric import largest
from .options import DrawOptions
from .themes import Theme
from .view import detail_line, diff_line, edit_line, largest_diff

PAGE_SCHEMA = 1
SEGMENT = 32  # at most this many items on one level of the page's tree


@dataclass
class PageModel:
    """What an interactive renderer needs: a title, looks, and the JSON-ready ``data``."""

    title: str
    theme: Theme
    direction: str
    data: dict[str, Any]

    @property
    def ops(self) -> int:
        """How many ops the page holds."""
        return len(self.data["ops"]["label"])


def build_page(trace: Any, opts: DrawOptions) -> PageModel:
    """The whole interactive view model of ``trace``; ``opts`` sets its starting state."""
    b = _Builder(trace, opts)
    segment = min(SEGMENT, opts.node_budget) if opts.collapse == "auto" else SEGMENT
    b.prepare(fold=True, roll=True, loops=opts.fold, segment=segment)
    # auto measures the folded tree it will draw; the other modes name calls of the whole tree
    tree = b.structure if opts.collapse == "auto" else b.full
    expanded = expanded_calls(tree, opts.collapse, opts.node_budget)
    return _Page(b).model(expanded)


class _Page:
    def __init__(self, b: _Builder):
        self.b = b
        self.op_ids = {op.label: i for i, op in enumerate(b.scoped)}
        self.call_ids = {key: i for i, key in enumerate(b.full.calls)}
        self.groups = list(b.remap.members)
        self.group_ids = {rep: g for g, rep in enumerate(self.groups)}
        self.member_of = {m: g for g, rep in enumerate(self.groups)
                          for m in b.remap.members[rep] if m != rep}

    def model(self, expanded: set[str]) -> PageModel:
        b, opts = self.b, self.b.opts
        folds = [g for g, rep in enumerate(self.groups) if b.remap.kind[rep] == "fold"]
        data = {
            "schema": PAGE_SCHEMA,
            "title": b.title(),
            "direction": opts.direction,
            "theme": asdict(opts.theme),
            "banner": _banner(b.trace),
            "diff": self._diff(),
            "metric": b.metric_name,  # what the "metric" columns hold (None: nothing)
            "ops": self._ops(),
            "calls": [self._call(key) for key in b.full.calls],
            "root": [self._item(kind, name) for kind, name in b.full.root],
            "groups": [self._group(rep) for rep in self.groups],
            "attention": page_patterns(b.trace),  # saved attention patterns (None: no panel)
            "names": page_names(b.trace),  # transformer names -> the op each stands on
            "start": {
                "expanded": sorted(self.call_ids[k] for k in expanded if k in self.call_ids),
                "unfolded": [] if opts.fold else folds,
                "rolled": opts.roll_recurrent,
            },
        }
        return PageModel(b.title(), opts.theme, opts.direction, data)

    def _item(self, kind: str, name: str) -> int:
        return self.op_ids[name] if kind == "op" else -(self.call_ids[name] + 1)

    # ---- ops ---------------------------------------------------------------------------------
    def _ops(self) -> dict[str, list[Any]]:
        b, remap = self.b, self.b.remap
        cols: dict[str, list[Any]] = {name: [] for name in (
            "label", "func", "kind", "module", "shape", "dtype", "params", "flops", "time_ns",
            "bytes", "parents", "stack", "alias", "group", "run", "lines", "edited", "metric",
            "dinfo")}
        runs = self._runs()
        for op in b.scoped:
            label = op.label
            params = b._op_params(label)
            shape = format_shape(op.shape, unknown="")
            alias = remap.alias.get(label)
            rep = remap.group_of.get(label)
            cols["label"].append(label)
            cols["func"].append(op.func)
            cols["kind"].append(op.kind)
            cols["module"].append(f"{op.module}:{op.module_pass}" if op.module else "")
            cols["shape"].append(shape)
            cols["dtype"].append(op.dtype or "")
            cols["params"].append(params)
            cols["flops"].append(op.flops)
            cols["time_ns"].append(op.time_ns)
            cols["bytes"].append(op.nbytes)
            cols["parents"].append([self.op_ids[p] for p in op.parents or () if p in self.op_ids])
            cols["stack"].append([self.call_ids[k] for k in b.stacks[label]])
            cols["alias"].append(self.op_ids[alias] if alias is not None else -1)
            cols["group"].append(self.group_ids.get(rep, -1) if rep is not None else -1)
            cols["run"].append(runs.get(label))
            cols["lines"].append(self._op_lines(op, shape, params))
            edits = b.edits_in([label])  # the largest change an edit made here, or None
            cols["edited"].append(max(row["norm"] for row in edits) if edits else None)
            cols["metric"].append(b.metrics.get(label))
            cols["dinfo"].append(op.meta.get("diff") if b.diff else None)  # both sides, a diff
        return cols

    def _diff(self) -> dict[str, Any] | None:
        """What a diff page says of the pair: names, tolerance, the first divergence's op."""
        diff = self.b.diff
        if not diff:
            return None
        first = diff.get("first")
        return {**diff, "first_op": self.op_ids.get(first) if first else None}

    def _op_lines(self, op: Any, shape: str, params: int) -> list[str]:
        """What the op's box says under its label (the static drawing's lines)."""
        lines = []
        b = self.b
        stack = b.stacks[op.label]
        if stack and len(self.b.full.calls[stack[-1]].ops) == 1 and not is_synthetic(stack[-1]):
            call = self.b.full.calls[stack[-1]]
            lines.append(f"{self._name(stack[-1])} · {call.type}")
        elif op.kind == "input" and isinstance(op.slot, str) and not op.slot.isdigit():
            lines.append(op.slot)
        if op.meta and op.meta.get("note"):  # a drawn graph's own word on the node
            lines.append(op.meta["note"])
        detail = detail_line(shape, params, op.dtype)
        edits = b.edits_in([op.label])
        diff = [diff_line(op.meta["diff"], b.diff_names)] if b.diff else []
        return [line for line in lines + [detail] + ([edit_line(edits)] if edits else []) + diff
                if line]

    def _runs(self) -> dict[str, list[int]]:
        """op → [fold group, member index]: edges between copies of a fold are not drawn."""
        runs: dict[str, list[int]] = {}
        for g, rep in enumerate(self.groups):
            if self.b.remap.kind[rep] != "fold":
                continue
            for index, member in enumerate(self.b.remap.members[rep]):
                for op in self.b.full.calls[member].ops:
                    runs[op] = [g, index]
        return runs

    # ---- calls and groups --------------------------------------------------------------------
    def _name(self, key: str) -> str:
        """A call's name relative to the real call around it (``conv1`` inside ``layer1.0``)."""
        b = self.b
        call = b.full.calls[key]
        if is_synthetic(key):
            return _synthetic_name(b, key)
        passes = len(b.trace.modules[call.address].calls)
        name = key if passes > 1 else call.address
        parent = call.parent
        while parent is not None and is_synthetic(parent):
            parent = b.full.calls[parent].parent
        if parent is None:
            return name
        return shorten(name, b.full.calls[parent].address + ".")

    def _call(self, key: str) -> dict[str, Any]:
        b = self.b
        call = b.full.calls[key]
        ops = [b.by_label[label] for label in call.ops]
        if is_synthetic(key):
            params = sum(b._op_params(op.label) for op in ops)
            time_ns = sum(op.time_ns for op in ops)
            shape = b.by_label[call.ops[-1]].shape
            kind = b.synthetic[key].kind
        else:
            module = b.trace.modules[call.address]
            params = module.num_params
            index = call.pass_num - 1
            time_ns = module.calls[index].time_ns if index < len(module.calls) else 0
            shape = b._call_shape(key)
            kind = "module"
        shape_text = format_shape(shape, unknown="")
        flops = [op.flops for op in ops if op.flops is not None]
        name = self._name(key)
        rep = key if key in b.remap.members else None
        member_of = self.member_of.get(key, -1)
        edits = b.edits_in(call.ops)
        edited = edit_line(edits) if edits else ""
        where = largest_diff(b.diffs_in(call.ops))[1]
        metric = largest(b.metrics, call.ops) if b.metrics else None
        if metric is not None and not b.diff:
            where = f"largest {b.metric_name} {metric:.3g}"
        return {
            "key": key, "address": call.address, "type": call.type, "pass": call.pass_num,
            "kind": kind, "depth": call.depth,
            "parent": self.call_ids[call.parent] if call.parent is not None else -1,
            "items": [self._item(k, n) for k, n in call.children],
            "title": name,
            "lines": [line for line in (call.type, detail_line(shape_text, params), edited, where)
                      if line],
            "edited": bool(edits), "metric": metric,
            "cluster": (f"{name}: {call.type}" if kind == "module" else f"{call.type} · {name}")
            + (f" · {where}" if where else ""),
            "atomic": len(call.ops) == 1 and not call.children[0][0] == "call",
            "params": params, "flops": sum(flops) if flops else None, "time_ns": time_ns,
            "bytes": sum(op.nbytes for op in ops), "ops": len(call.ops), "shape": shape_text,
            "group": self.group_ids[rep] if rep else -1, "member_of": member_of,
        }

    def _group(self, rep: str) -> dict[str, Any]:
        b = self.b
        parent = b.full.calls[rep].parent
        while parent is not None and is_synthetic(parent):
            parent = b.full.calls[parent].parent
        cluster = f"cluster:{parent}" if parent is not None else None  # names relative to it
        node = b._call_node("page", rep, cluster)
        members = b.remap.members[rep]
        calls = [b.full.calls[m] for m in members]
        flops = [op.flops for c in calls for op in (b.by_label[x] for x in c.ops)
                 if op.flops is not None]
        ops = [x for c in calls for x in c.ops]
        where = largest_diff(b.diffs_in(ops))[1]
        metric = largest(b.metrics, ops) if b.metrics else None
        return {
            "kind": b.remap.kind[rep], "rep": self.call_ids[rep], "count": len(members),
            "members": [self.call_ids[m] for m in members],
            "title": node.title, "lines": node.lines, "cluster": b._call_title(rep, cluster),
            "params": node.params, "flops": sum(flops) if flops else None,
            "time_ns": sum(b.by_label[x].time_ns for c in calls for x in c.ops),
            "bytes": sum(b.by_label[x].nbytes for c in calls for x in c.ops),
            "ops": sum(len(c.ops) for c in calls), "metric": metric, "diff_line": where,
        }


def _synthetic_name(b: _Builder, key: str) -> str:
    info = b.synthetic[key]
    first, last = info.ops[0], info.ops[-1]
    if info.kind == "loop":
        return f"step {split_pass(key)[1]}: {first} … {last}"
    return f"{first} … {last}"


def _banner(trace: Any) -> str | None:
    """The provenance line of a synthesized-input trace (None for the caller's real input)."""
    provenance = getattr(trace, "provenance", None) or {}
    if provenance.get("origin", "gold") == "gold":
        return None
    from ..summary import describe_provenance

    return describe_provenance(provenance)
