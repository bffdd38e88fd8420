"""Build the GraphView of a Trace: scope to a module, fold/roll, collapse, label nodes and edges.

One pass over the ops for each step, so a 12-layer GPT-2 (~500 ops) builds in milliseconds.
"""

from __future__ import annotations

from typing import Any

from ..errors import LookupFailed
from ..sites import name_of, split_pass
from ..units import format_shape
from .collapse import Remap, Structure, expanded_calls, fold_repeats, roll_passes
from .groups import Synthetic, group_stacks, is_synthetic
from .metric import largest, op_metrics
from .options import DrawOptions, check_options
from .view import (
    GraphView,
    ViewCluster,
    ViewEdge,
    ViewNode,
    detail_line,
    diff_line,
    edit_line,
    largest_diff,
)


def build_view(trace: Any, options: DrawOptions | None = None, **dials: Any) -> GraphView:
    """The drawable graph of ``trace`` under ``options`` (or the same dials as keywords)."""
    opts = options if options is not None else check_options(**dials)
    return _Builder(trace, opts).build()


class _Builder:
    def __init__(self, trace: Any, opts: DrawOptions):
        self.trace, self.opts = trace, opts
        self.by_label = {op.label: op for op in trace.ops}
        self.edited: dict[str, list[dict]] = {}  # op label -> the edits that fired there
        for row in trace.edits if trace.edited else ():
            if row["fired"]:
                self.edited.setdefault(row["label"], []).append(row)
        self.diff = trace.meta.get("diff")  # a diff drawing: each op's difference in op.meta
        self.diff_names = (self.diff["a"], self.diff["b"]) if self.diff else ("", "")
        found = op_metrics(trace, opts)  # the number the drawing is coloured by, per op
        self.metric_name, self.metrics = found if found else (None, {})
        self.nodes: dict[str, ViewNode] = {}
        self.clusters: dict[str, ViewCluster] = {}
        self.edges: dict[tuple[str, str], ViewEdge] = {}
        self._by_key = False

    # ---- steps -------------------------------------------------------------------------------
    def build(self) -> GraphView:
        trace, opts = self.trace, self.opts
        self.prepare(fold=opts.fold, roll=opts.roll_recurrent, loops=opts.fold,
                     segment=opts.node_budget if opts.collapse == "auto" else None)
        self.expanded = expanded_calls(self.structure, opts.collapse, opts.node_budget)
        self.unit_of: dict[str, str] = {}
        for label in self.drawn:
            self.unit_of[label] = self._place(label)
        for label in self.stacks:
            if label in self.remap.alias:
                self.unit_of[label] = self.unit_of[self.remap.resolve(label)]
        self._edges()
        self._short_ids()
        return GraphView(
            title=self.title(), nodes=list(self.nodes.values()), edges=list(self.edges.values()),
            clusters=list(self.clusters.values()), theme=opts.theme, direction=opts.direction,
            meta={"model_class": trace.meta.get("model_class", ""), "collapse": opts.collapse,
                  "module": opts.module, "ops": len(self.scoped), "folded": self._folds(),
                  **({"diff": self.diff} if self.diff else {}),
                  **({"metric": self.metric_name} if self.metric_name else {})},
        )

    def title(self) -> str:
        """The drawing's title: the model class, and the ``module=`` scope when there is one."""
        module = self.opts.module
        return ("Diff " if self.diff else "") + self.trace.meta.get("model_class", "model") \
            + (f" · {module}" if module else "") + (" · EDITED" if self.trace.edited else "")

    def edits_in(self, labels: list[str]) -> list[dict]:
        """The fired edits at any of ``labels``."""
        return [row for label in labels for row in self.edited.get(label, ())] \
            if self.edited else []

    def diffs_in(self, labels: list[str]) -> list[dict]:
        """The differences of ``labels`` in a diff drawing (empty otherwise)."""
        return [self.by_label[label].meta["diff"] for label in labels] if self.diff else []

    def prepare(self, *, fold: bool, roll: bool, loops: bool, segment: int | None) -> None:
        """Scope the ops, group loops and segments, fold and roll: the call trees to draw.

        Sets ``full`` (every call), ``remap`` (what folds onto what), ``drawn`` (the ops left
        after folding) and ``structure`` (the call tree of ``drawn``).
        """
        trace = self.trace
        self.scoped, self.stacks = self._scope()
        prints = {op.label: self._fingerprint(op) for op in self.scoped}
        parents = {op.label: op.parents or () for op in self.scoped}
        types = {address: module.type for address, module in trace.modules.items()}
        self.synthetic: dict[str, Synthetic] = {}
        if loops or segment is not None:
            self.stacks, self.synthetic = group_stacks(list(self.stacks), self.stacks, prints,
                                                       parents, types, loops=loops,
                                                       segment=segment)
        depths = {address: module.depth for address, module in trace.modules.items()}
        base = self._scope_depth()
        for info in self.synthetic.values():
            types[info.address] = "Loop" if info.kind == "loop" else "Segment"
            scope = name_of(info.scope) if info.scope else None
            depths[info.address] = depths[scope] if scope else base
        self.full = Structure(self.stacks, self.stacks, prints, types, depths, base)
        self.remap = Remap()
        if fold:
            fold_repeats(self.full, parents, self.remap)
        if roll:
            roll_passes(self.full, self.remap, parents, prints, self.stacks)
        self.drawn = [label for label in self.stacks if label not in self.remap.alias]
        self.structure = Structure(self.drawn, self.stacks, prints, types, depths, base)

    def _fingerprint(self, op: Any) -> tuple:
        """What must match for two ops to count as the same step of a repeated block."""
        params = self.trace.params
        shapes = tuple(tuple(params.get(p, {}).get("shape", ())) for p in op.params or ())
        return op.func, tuple(op.shape or ()), shapes

    def _scope_depth(self) -> int:
        """Address depth of the ``module=`` scope (0: the whole model)."""
        module = self.opts.module
        if not module:
            return 0
        address = name_of(module) if self._by_key else module
        found = self.trace.modules.get(address)
        return found.depth if found is not None else 0

    def _scope(self) -> tuple[list[Any], dict[str, tuple[str, ...]]]:
        """The ops to draw and their module stacks relative to the ``module=`` scope."""
        module = self.opts.module
        ops = self.trace.ops
        if not module:
            return list(ops), {op.label: tuple(op.module_stack or ()) for op in ops}
        by_key = self._by_key = split_pass(module)[1] is not None and \
            module not in self.trace.modules
        scoped, stacks = [], {}
        for op in ops:
            stack = op.module_stack or ()
            for i, key in enumerate(stack):
                if key == module if by_key else name_of(key) == module:
                    scoped.append(op)
                    stacks[op.label] = tuple(stack[i + 1:])
                    break
        if not scoped:
            import difflib

            close = difflib.get_close_matches(module, list(self.trace.modules), n=3, cutoff=0.5)
            raise LookupFailed(
                f"module={module!r} matches no module call with ops in this trace",
                code="key_not_found",
                teach=[f'module="{name}"' for name in close] + ["list(trace.modules)"],
            )
        return scoped, stacks

    def _place(self, label: str) -> str:
        """Create (once) the node that ``label`` is drawn in; return its id."""
        chain: list[str] = []
        unit = None
        for key in self.stacks[label]:
            if key not in self.expanded:
                unit = key
                break
            chain.append(key)
        node_id = f"call:{unit}" if unit else f"op:{label}"
        if node_id not in self.nodes:
            cluster = self._cluster_of(chain)
            if unit:
                node = self._call_node(node_id, unit, cluster)
            else:
                node = self._op_node(node_id, self.by_label[label], chain, cluster)
            node.cluster = cluster
            self.nodes[node_id] = node
        return node_id

    def _cluster_of(self, chain: list[str]) -> str | None:
        """The innermost drawn cluster of an expanded-call chain, creating clusters on the way."""
        parent = None
        for key in chain:
            call = self.structure.calls[key]
            level = 1 + (self.clusters[parent].depth if parent else 0)
            if len(call.ops) < 2 or (self.opts.depth is not None and level > self.opts.depth):
                continue  # single-op calls label their node instead; depth= caps nesting
            cid = f"cluster:{key}"
            if cid not in self.clusters:
                self.clusters[cid] = ViewCluster(cid, self._call_title(key, parent), parent,
                                                 level, self.remap.count.get(key, 1))
            parent = cid
        return parent

    # ---- labels ------------------------------------------------------------------------------
    def _op_node(self, node_id: str, op: Any, chain: list[str], cluster: str | None) -> ViewNode:
        title, lines, count = op.label, [], 1
        if chain and len(self.structure.calls[chain[-1]].ops) == 1:
            key = chain[-1]
            call = self.structure.calls[key]
            count = self.remap.count.get(key, 1)
            if self.remap.kind.get(key) == "fold":
                lines.append(f"{call.type} · {self._span(key, cluster)}")
            else:
                lines.append(f"{self._call_name(key, cluster)} · {call.type}")
        elif op.kind == "input" and isinstance(op.slot, str) and not op.slot.isdigit():
            lines.append(op.slot)
        if op.meta and op.meta.get("note"):  # a drawn graph's own word on the node
            lines.append(op.meta["note"])
        count = max(count, self.remap.op_count.get(op.label, 1))
        if count > 1:
            title += f" ×{count}"
        shape = format_shape(op.shape, unknown="")
        params = sum(self.trace.params.get(p, {}).get("numel", 0) for p in op.params or ())
        lines.append(detail_line(shape, params, op.dtype))
        edits = self.edits_in([op.label])
        if edits:
            lines.append(edit_line(edits))
        node = ViewNode(node_id, op.kind, title, [line for line in lines if line], shape, params,
                        count, edited=bool(edits))
        node.metric = self.metrics.get(op.label)
        if self.diff:
            d = op.meta["diff"]
            node.status = d["status"]
            node.lines.append(diff_line(d, self.diff_names))
        elif node.metric is not None:
            node.lines.append(f"{self.metric_name} {node.metric:.3g}")
        return node

    def _call_node(self, node_id: str, key: str, cluster: str | None) -> ViewNode:
        call = self.structure.calls[key]
        count = self.remap.count.get(key, 1)
        kind = self.remap.kind.get(key)
        members = self.remap.members.get(key, [key])
        modules = self.trace.modules
        if is_synthetic(key):
            title = (f"{call.type} ×{count}" if kind == "fold" else
                     self._call_name(key, cluster) + (f" ×{count}" if count > 1 else ""))
            lines = [self._span(key, cluster) if kind == "fold" else call.type]
            params = sum(self._op_params(op) for m in members for op in self.full.calls[m].ops)
        elif kind == "fold":
            title, lines = f"{call.type} ×{count}", [self._span(key, cluster)]
            params = sum(modules[name_of(m)].num_params for m in members)
        else:
            title = self._call_name(key, cluster) + (f" ×{count}" if count > 1 else "")
            lines = [call.type]
            params = modules[call.address].num_params
        shape = format_shape(self._call_shape(members[-1]), unknown="")
        lines.append(detail_line(shape, params))
        edits = self.edits_in([op for m in members for op in self.full.calls[m].ops])
        if edits:
            lines.append(edit_line(edits))
        ops = [op for m in members for op in self.full.calls[m].ops]
        where = largest_diff(self.diffs_in(ops))[1]
        metric = largest(self.metrics, ops) if self.metrics else None
        if metric is not None and not self.diff:
            where = f"largest {self.metric_name} {metric:.3g}"
        return ViewNode(node_id, "module", title, [line for line in lines + [where] if line],
                        shape, params, count, ops=len(call.ops) * count, edited=bool(edits),
                        metric=metric)

    def _call_name(self, key: str, cluster: str | None = None) -> str:
        """``layer1.0`` (``conv1`` inside the ``layer1.0`` cluster); ``cell:2``: an unrolled pass.

        Names inside a cluster are relative to it, so a folded block's ops read ``attn``, not
        the address of the one copy that stands for all of them.
        """
        call = self.structure.calls[key]
        if is_synthetic(key):
            ops = self.synthetic[key].ops
            if self.synthetic[key].kind == "loop":
                return f"step {call.pass_num}: {ops[0]} … {ops[-1]}"
            return f"{ops[0]} … {ops[-1]}"
        passes = len(self.trace.modules[call.address].calls)
        name = key if passes > 1 and self.remap.kind.get(key) != "roll" else call.address
        return self._relative(name, cluster)

    def _call_title(self, key: str, cluster: str | None = None) -> str:
        """A cluster's label: ``attn: GPT2Attention``, ``GPT2Block ×12 · transformer.h.0–11``."""
        call = self.structure.calls[key]
        count = self.remap.count.get(key, 1)
        worst = ""
        if self.diff:
            members = self.remap.members.get(key, [key])
            worst = largest_diff(self.diffs_in([op for m in members
                                                for op in self.full.calls[m].ops]))[1]
            worst = f" · {worst}" if worst else ""
        if self.remap.kind.get(key) == "fold":
            return f"{call.type} ×{count} · {self._span(key, cluster)}{worst}"
        name = self._call_name(key, cluster)
        return f"{name}: {call.type}" + (f" ×{count}" if count > 1 else "") + worst

    def _span(self, key: str, cluster: str | None = None) -> str:
        """``transformer.h.0–11`` for a fold of ``transformer.h.0`` … ``transformer.h.11``."""
        members = self.remap.members[key]
        if is_synthetic(key):
            ops = self.synthetic[key].ops
            return f"{len(ops)} ops a step: {ops[0]} … {ops[-1]}"
        first = self._relative(name_of(members[0]), cluster)
        last = self._relative(name_of(members[-1]), cluster)
        head, _, _ = first.rpartition(".")
        head2, _, end = last.rpartition(".")
        return f"{first}–{end}" if head == head2 else f"{first} … {last}"

    def _relative(self, name: str, cluster: str | None) -> str:
        """``name`` without the address of ``cluster`` (or of the ``module=`` scope) in front.

        An index alone keeps the container's last name: ``downsample.0``, ``layer1.0``.
        """
        while cluster is not None and is_synthetic(cluster.removeprefix("cluster:")):
            cluster = self.clusters[cluster].parent if cluster in self.clusters else None
        if cluster is not None:
            prefix = self.structure.calls[cluster.removeprefix("cluster:")].address + "."
        elif self.opts.module:
            prefix = name_of(self.opts.module) if self._by_key else self.opts.module
            prefix += "."
        else:
            return name
        return shorten(name, prefix)

    def _op_params(self, label: str) -> int:
        """Parameters an op reads (0 for most ops)."""
        params = self.trace.params
        return sum(params.get(p, {}).get("numel", 0) for p in self.by_label[label].params or ())

    def _call_shape(self, key: str) -> Any:
        if is_synthetic(key):
            return self.by_label[self.synthetic[key].ops[-1]].shape
        address, pass_num = split_pass(key)
        calls = self.trace.modules[address].calls
        index = pass_num - 1
        if 0 <= index < len(calls) and calls[index].output_ops:
            return self.by_label[calls[index].output_ops[0]].shape
        ops = calls[index].ops if 0 <= index < len(calls) else ()
        return self.by_label[ops[-1]].shape if ops else None

    # ---- edges -------------------------------------------------------------------------------
    def _edges(self) -> None:
        run_of, inside = self.remap.run_of, self.stacks
        for op in self.scoped:
            head = self.unit_of[op.label]
            for parent in op.parents or ():
                if parent not in self.by_label:
                    continue  # not an op of this trace (nothing to draw it from)
                if parent not in inside:
                    tail = self._boundary(parent, "in")
                else:
                    tail = self.unit_of[parent]
                    a, b = run_of.get(parent), run_of.get(op.label)
                    if a and b and a[0] == b[0] and a[1] != b[1]:
                        continue  # the chain between folded copies is what "×N" says
                    if tail == head and (tail.startswith("call:") or parent == op.label):
                        continue
                self._edge(tail, head, parent, op.label)
            if self.opts.module:
                for child in op.children or ():
                    if child not in inside and child in self.by_label:
                        self._edge(head, self._boundary(child, "out"), op.label)

    def _edge(self, tail: str, head: str, source_label: str, dest_label: str | None = None
              ) -> None:
        if (tail, head) not in self.edges:
            source = self.by_label[source_label]
            label = format_shape(source.shape, unknown="")
            dest = self.by_label.get(dest_label) if dest_label else None
            if dest is not None and source.device and dest.device and \
                    source.device != dest.device:  # a model split over devices: say where
                label = f"{label} {source.device}→{dest.device}".strip()
            self.edges[(tail, head)] = ViewEdge(tail, head, label)

    def _boundary(self, label: str, side: str) -> str:
        """A node for a tensor entering (``in``) or leaving (``out``) the ``module=`` scope."""
        node_id = f"{side}:{label}"
        if node_id not in self.nodes:
            op = self.by_label[label]
            where = op.module or ("input" if op.kind == "input" else "model")
            lines = [f"{'from' if side == 'in' else 'to'} {where}"]
            shape = format_shape(op.shape, unknown="")
            if side == "in":
                lines.append(detail_line(shape, 0, op.dtype))
            self.nodes[node_id] = ViewNode(node_id, "boundary", label, lines, shape)
        return node_id

    def _short_ids(self) -> None:
        """Renumber nodes ``n0``… and clusters ``c0``… in order: ids safe in any renderer."""
        ids = {old: f"n{i}" for i, old in enumerate(self.nodes)}
        ids.update({old: f"c{i}" for i, old in enumerate(self.clusters)})
        for node in self.nodes.values():
            node.id = ids[node.id]
            node.cluster = ids.get(node.cluster) if node.cluster else None
        for cluster in self.clusters.values():
            cluster.id = ids[cluster.id]
            cluster.parent = ids.get(cluster.parent) if cluster.parent else None
        for edge in self.edges.values():
            edge.tail, edge.head = ids[edge.tail], ids[edge.head]

    def _folds(self) -> list[str]:
        return [self._call_title(key) for key, kind in self.remap.kind.items()
                if kind == "fold" and key in self.structure.calls]


def shorten(name: str, prefix: str) -> str:
    """``name`` relative to the enclosing box's ``prefix`` (``h.0.attn`` -> ``attn``); a bare
    index keeps its container's name (``layers.3``)."""
    short = name.removeprefix(prefix)
    if short == name:
        return name
    if name_of(short).isdigit():
        return prefix[:-1].rpartition(".")[2] + "." + short
    return short
