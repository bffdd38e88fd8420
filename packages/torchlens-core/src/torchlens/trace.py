"""The Trace: every op of one forward pass, its graph, modules and parameters, with lookup.

Node kinds are a closed set (``OP_KINDS``); every field of ``Op`` is documented on the class.
Plugins may put JSON-safe facts in ``op.meta`` / ``trace.meta``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields
from typing import Any

from .capabilities import lookup
from .collector import paused
from .edit_log import EditLog
from .errors import LookupFailed, TorchLensError, grads_unavailable
from .sites import split_pass, transformer_name
from .units import format_shape

NO_GRAD = object()  # an op's gradient when none of its outputs needs one

SCHEMA_VERSION = 1
OP_KINDS = ("input", "op", "output")

@dataclass(slots=True, eq=False, repr=False)
class Op:
    """One node of the graph.

    kind: "input" (a tensor the caller passed), "op" (a torch call), "output" (a returned tensor).
    label: unique name (``conv2d_3``; ``linear_1:2`` for pass 2 of a repeated module call).
    base_label / pass_num: the label without its pass, and the pass (1 when not repeated).
    func: torch function name (``conv2d``, ``add_``, ``getitem``); "input"/"output" for those kinds.
    parents / children: labels of the ops this one reads from / that read it (graph edges).
    shape, dtype, device: of the first tensor output; out_shapes: every tensor output's shape.
    nbytes: bytes of all tensor outputs. module / module_pass: innermost module address and its pass
    ("" is the root model). module_stack: enclosing calls outermost first, as "address:pass".
    module_outputs: module calls ("address:pass") whose output is this op's output.
    params / buffers: addresses consumed directly by this call. time_ns: measured wall time.
    flops: from torch.utils.flop_counter's formulas, None when no formula applies.
    inplace: the call mutated its first argument; is_view: the output aliases an input's storage.
    slot: for inputs, the positional index or keyword name; for outputs, the path in the output.
    saved: whether the activation was kept (read it as ``op.out``). meta: free-form, for plugins.
    """

    index: int = 0
    label: str = ""
    base_label: str = ""
    pass_num: int = 1
    kind: str = "op"
    func: str = ""
    parents: list = None
    children: list = None
    shape: list | None = None
    dtype: str | None = None
    device: str | None = None
    out_shapes: list = None
    nbytes: int = 0
    module: str = ""
    module_pass: int = 1
    module_stack: list = None
    module_outputs: list = None
    params: list = None
    buffers: list = None
    time_ns: int = 0
    flops: int | None = None
    inplace: bool = False
    is_view: bool = False
    slot: str | None = None
    saved: bool = False
    meta: dict = None
    _value: Any = None
    _reads: Any = field(default=None, init=False)  # the trace's _Reads (not the trace: no cycle)
    _grad: Any = field(default=None, init=False)  # set by trace.backward (save_grads= sites)
    _local: Any = field(default=None, init=False)  # this rank's part, of a sharded model's op

    @property
    def out(self) -> Any:
        """The saved activation: the op's output as it was right after the op ran, detached.
        A saved view shares memory with the saved value it views, as in the forward."""
        if not self.saved:
            raise TorchLensError(
                f"op {self.label!r} has no saved activation",
                code="activation_not_saved",
                teach=[
                    f"tl.trace(model, x, save=[{self.label!r}])",
                    "tl.trace(model, x, save='all')",
                ],
            )
        if self._reads is not None:
            self._reads.on_value_read()
        return self._value

    @property
    def local(self) -> Any:
        """This process's part of the value, for a model sharded across processes: a DTensor
        with its placement and device mesh (``op.out`` is the whole value; ``meta['sharded']``
        names the placement). The saved value itself for any other op."""
        return self._local if self._local is not None else self.out

    @property
    def grad(self) -> Any:
        """The gradient of ``trace.backward``'s target with respect to this op's output, as the
        op made it (a tuple for an op of several outputs); same shape as the output."""
        if self._grad is None:
            raise grads_unavailable(
                f"op {self.label!r} has no gradient: it is not a site of save_grads=, or "
                "trace.backward(target) has not run",
                teach=[f"tl.trace(model, x, save_grads=[{self.label!r}])",
                       "trace.backward(target)"])
        if self._grad is NO_GRAD:
            raise grads_unavailable(
                f"op {self.label!r}'s output needs no gradient ({self.dtype}, or made from "
                "nothing that requires grad)", teach=["trace.grads  # the sites that have one"])
        return self._grad

    @property
    def edits(self) -> list[dict[str, Any]]:
        """The rows of ``trace.edits`` that fired at this op (empty when no edit did)."""
        return self._reads.edits_at(self) if self._reads is not None else []

    @property
    def edited(self) -> bool:
        """Whether an edit changed this op's value (or gradient, for ``grad_edits=``)."""
        return bool(self.edits)

    def row(self) -> dict[str, Any]:
        """This op's fields as a plain dict (no tensors)."""
        return {name: getattr(self, name) for name in OP_FIELDS}

    def __repr__(self) -> str:
        where = f" in {self.module or '<model>'}" if self.kind == "op" else ""
        shape = format_shape(self.shape)
        return (f"<Op {self.label}: {self.func} -> {shape} {self.dtype or ''}{where}"
                f"{edited_note(self.edits)}>")


def edited_note(rows: list[dict[str, Any]]) -> str:
    """``, EDITED: add, change norm 23.6`` for an op's fired edit rows ("" for none)."""
    if not rows:
        return ""
    kinds = list(dict.fromkeys(row["kind"] for row in rows))
    norms = [row["norm"] for row in rows if row.get("norm") is not None]
    return f", EDITED: {', '.join(kinds)}" + (f", change norm {max(norms):.4g}" if norms else "")


# Op fields that are plain JSON data, in the order rows() and the saved file use.
OP_FIELDS = tuple(f.name for f in fields(Op) if not f.name.startswith("_"))


class ModuleCall:
    """One call of a submodule: its ops and the ops that produced its output."""

    __slots__ = ("address", "pass_num", "type", "ops", "output_ops", "time_ns", "positions",
                 "_by_label")

    def __init__(self, address, pass_num, type, ops, output_ops, time_ns, by_label=None,
                 positions=None):
        self.address, self.pass_num, self.type = address, pass_num, type
        self.ops, self.output_ops, self.time_ns = ops, output_ops, time_ns
        # which tensor of each output op's result (an LSTM returns several from one op)
        self.positions = positions if positions is not None else [0] * len(output_ops)
        self._by_label = by_label  # the trace's label index: no reference back to the trace

    @property
    def label(self) -> str:
        """``address:pass``, the key ``trace[...]`` takes for this call."""
        return f"{self.address}:{self.pass_num}"

    @property
    def out(self) -> Any:
        """The saved output of this call (a tensor, or a tuple when it returned several)."""
        values = []
        for label, position in zip(self.output_ops, self.positions):
            value = self._by_label[label].out
            values.append(value[position] if isinstance(value, tuple) else value)
        if not values:
            raise TorchLensError(
                f"module call {self.label} returned no tensor produced inside the capture",
                code="activation_not_saved",
            )
        return values[0] if len(values) == 1 else tuple(values)

    @property
    def grad(self) -> Any:
        """The gradient with respect to this call's output (a tuple when it returned several),
        after ``trace.backward``; the module must be a site of ``save_grads=``."""
        values = []
        for label, position in zip(self.output_ops, self.positions):
            grad = self._by_label[label].grad
            values.append(grad[position] if isinstance(grad, tuple) else grad)
        if not values:
            raise grads_unavailable(f"module call {self.label} returned no tensor made inside the "
                              "capture")
        return values[0] if len(values) == 1 else tuple(values)

    def row(self) -> dict[str, Any]:
        """This one's fields as a plain dict (no tensors)."""
        return {s: getattr(self, s) for s in ("address", "pass_num", "type", "ops", "output_ops",
                                              "time_ns", "positions")}

    def __repr__(self) -> str:
        return f"<ModuleCall {self.label} ({self.type}): {len(self.ops)} ops>"


class Module:
    """A submodule of the traced model with every call it made during the forward."""

    __slots__ = ("address", "type", "depth", "num_params", "calls")

    def __init__(self, address, type, depth, num_params, calls):
        self.address, self.type, self.depth = address, type, depth
        self.num_params, self.calls = num_params, calls

    def _only_call(self, what: str) -> ModuleCall:
        """The one call, for ``out`` and ``grad``; several calls refuse, naming each."""
        if len(self.calls) != 1:
            raise LookupFailed(
                f"module {self.address!r} ran {len(self.calls)} times; pick one call",
                code="key_not_found",
                teach=[f"trace[{self.address + ':' + str(i)!r}].{what}" for i in
                       range(1, len(self.calls) + 1)][:3],
            )
        return self.calls[0]

    @property
    def out(self) -> Any:
        """The saved output when the module ran exactly once."""
        return self._only_call("out").out

    @property
    def grad(self) -> Any:
        """The gradient with respect to the output, when the module ran exactly once."""
        return self._only_call("grad").grad

    def copy(self, rename: dict[str, str] | None = None) -> Module:
        """A copy with calls of its own (op labels renamed by ``rename``), for another Trace:
        linking a Trace points its calls at that trace's ops."""
        rename = rename or {}
        calls = [ModuleCall(c.address, c.pass_num, c.type, [rename.get(x, x) for x in c.ops],
                            [rename.get(x, x) for x in c.output_ops], c.time_ns,
                            positions=list(c.positions)) for c in self.calls]
        return Module(self.address, self.type, self.depth, self.num_params, calls)

    def row(self) -> dict[str, Any]:
        """This one's fields as a plain dict (no tensors)."""
        return {"address": self.address, "type": self.type, "depth": self.depth,
                "num_params": self.num_params, "calls": [c.row() for c in self.calls]}

    def __repr__(self) -> str:
        return f"<Module {self.address} ({self.type}): {len(self.calls)} call(s)>"


class Trace:
    """The record of one forward pass: ops in execution order, modules, parameters, provenance."""

    def __init__(self, ops, modules, params, buffers, output_structure, meta, provenance=None,
                 annotations=None):
        self._pending: Callable[[], tuple] | None = None
        self._count = len(ops)
        self._reads = _Reads(provenance or {}, meta)
        self._link(ops, modules, params, buffers)
        self.output_structure = output_structure
        self.annotations: dict[str, Any] = annotations or {"capture_advisories": []}
        self.annotations.setdefault("capture_advisories", [])
        self.receipt = None  # set by pinned surfaces
        self._objects: dict[str, Any] = {}  # resolver objects (e.g. a tokenizer); never saved

    @classmethod
    def deferred(cls, build: Callable[[], tuple], count: int, output_structure, meta,
                 provenance=None, annotations=None) -> Trace:
        """A trace whose ops, modules, params and buffers ``build()`` makes on first use (a
        capture keeps raw records; the objects cost nothing until someone reads them)."""
        trace = cls([], {}, {}, {}, output_structure, meta, provenance, annotations)
        trace._pending, trace._count = build, count
        return trace

    def _link(self, ops, modules, params, buffers) -> None:
        self._ops: list[Op] = ops
        self._modules: dict[str, Module] = modules
        self._params: dict[str, dict] = params
        self._buffers: dict[str, dict] = buffers
        by_label: dict[str, Op] = {}
        reads = self._reads
        for op in ops:
            op._reads = reads
            by_label[op.label] = op
            if op.pass_num == 1:
                by_label.setdefault(f"{op.label}:1", op)
        self._by_label = by_label
        for module in modules.values():
            for call in module.calls:
                call._by_label = by_label

    def _materialize(self) -> None:
        build, self._pending = self._pending, None
        with paused():
            self._link(*build())

    def _built(self) -> Trace:
        if self._pending is not None:
            self._materialize()
        return self

    ops = property(lambda self: self._built()._ops, doc="Every node in execution order.")
    modules = property(lambda self: self._built()._modules, doc="Submodules that ran, by address.")
    params = property(lambda self: self._built()._params,
                      doc="Parameters by name: shape, dtype, device, numel, nbytes, trainable, "
                          "module, users.")
    buffers = property(lambda self: self._built()._buffers, doc="Buffers by name.")

    @property
    def meta(self) -> dict[str, Any]:
        """Facts of the capture (model class, options, ``edits`` fired, plugins' JSON facts)."""
        return self._reads.meta

    @meta.setter
    def meta(self, value: dict[str, Any]) -> None:
        self._reads.meta = value

    @property
    def provenance(self) -> dict[str, Any]:
        """Where the input came from (gold, declared, synthesized) and how it was resolved."""
        return self._reads.provenance

    @provenance.setter
    def provenance(self, value: dict[str, Any]) -> None:
        self._reads.provenance = value or {}

    # ---- lookup -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._count if self._pending is not None else len(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]
        except (LookupFailed, TypeError):
            return False
        return True

    def __getitem__(self, key: int | str) -> Op | Module | ModuleCall:
        """An op by label, pass label or index; a Module by address; a ModuleCall by "addr:pass";
        a transformer name (``blocks.3.attn.hook_z``) as a ``transformer.Named``."""
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise TypeError(f"trace keys are labels, indices or module addresses, not {key!r}")
        if isinstance(key, int):
            try:
                return self.ops[key]
            except IndexError:
                raise LookupFailed(
                    f"index {key} is out of range for a trace of {len(self.ops)} ops",
                    code="key_not_found", teach=["trace[0]", "trace[-1]", "len(trace)"],
                ) from None
        if self._pending is not None:
            self._materialize()
        op = self._by_label.get(key)
        if op is not None:
            return op
        if key in self.modules:
            return self.modules[key]
        address, pass_num = split_pass(key)
        if address in self.modules and pass_num is not None:
            calls = self.modules[address].calls
            if 1 <= pass_num <= len(calls):
                return calls[pass_num - 1]
        if transformer_name(key) is not None:  # blocks.3.hook_resid_post: the transformer view
            return lookup("transformer_name")(self, key)
        raise LookupFailed(
            f"no op label, pass label, index or module address matches {key!r}",
            code="key_not_found",
            teach=[f"trace[{name!r}]" for name in self._close_keys(key)]
            or ["[op.label for op in trace]", "list(trace.modules)"],
        )

    def _close_keys(self, key: str) -> list[str]:  # after __getitem__ materialized
        import difflib

        names = list(self._by_label) + list(self.modules)
        return difflib.get_close_matches(key, names, n=3, cutoff=0.6)

    @property
    def inputs(self) -> list[Op]:
        """The input nodes (``input_1``, ...), in order."""
        return [op for op in self.ops if op.kind == "input"]

    @property
    def outputs(self) -> list[Op]:
        """The output nodes, in order."""
        return [op for op in self.ops if op.kind == "output"]

    @property
    def output(self) -> Any:
        """The model's output rebuilt from the saved output tensors (mappings become dicts).
        On a ``save_grads=`` trace, the forward's own output with its autograd graph, to
        compute a target for ``trace.backward`` from (until that backward frees it)."""
        grads = self._objects.get("grads")
        if grads is not None and grads.output is not None:
            return grads.output
        if any(op.saved for op in self.outputs):
            self._on_value_read()
        return _rebuild(self.output_structure, self)

    # ---- tables ------------------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """One plain dict per op, in execution order: the table every surface builds on."""
        return [op.row() for op in self.ops]

    @property
    def device_crossings(self) -> list[tuple[str, str, str, str]]:
        """Edges whose tensor changes device (a model split over devices):
        ``(parent label, child label, from device, to device)``."""
        return [(parent, op.label, self[parent].device, op.device) for op in self.ops
                for parent in op.parents or () if parent in self._by_label
                and self[parent].device and op.device and self[parent].device != op.device]

    @property
    def edited(self) -> bool:
        """Whether this trace ran with edits (``edits=``): its values are not the model's own."""
        return "edits" in self.meta

    @property
    def edits(self):
        """The proof of firing: one row per site and pass where an edit applied (label,
        module, shape, index, norm of the change); empty for an unedited trace."""
        record = self.meta.get("edits") or {"specs": [], "fired": []}
        grads = self.meta.get("grad_edits") or {"specs": [], "fired": []}
        record = {"specs": record["specs"] + grads["specs"],
                  "fired": record["fired"] + grads["fired"]}
        rows = []
        for row in record["fired"]:
            if row["label"] is None and row.get("op_index") is not None:
                row = dict(row, label=self.ops[row["op_index"]].label)
            rows.append(row)
        return EditLog(rows, record["specs"])

    @property
    def num_params(self) -> int:
        """Parameters of the model, tied parameters counted once."""
        return sum(p["numel"] for p in self.params.values())

    @property
    def total_flops(self) -> int | None:
        """FLOPs summed over the ops that have a count; None when none has."""
        known = [op.flops for op in self.ops if op.flops is not None]
        return sum(known) if known else None

    def __repr__(self) -> str:
        n_ops = sum(op.kind == "op" for op in self.ops)
        origin = self.provenance.get("origin", "gold")
        saved = sum(bool(op.saved) for op in self.ops)
        return (
            f"<Trace of {self.meta.get('model_class', 'model')}: {n_ops} ops, "
            f"{len(self.inputs)} input(s), {len(self.outputs)} output(s), "
            f"{len(self.modules)} modules, {self.num_params:,} params, {saved} saved, "
            f"input {origin}{self._edited_note()}>"
        )

    def _edited_note(self) -> str:
        if not self.edited:
            return ""
        specs = self.meta["edits"]["specs"]
        return (f", EDITED: {len(specs)} edit(s) at {[e['site'] for e in specs][:4]}, "
                "values are not the model's own")

    def __str__(self) -> str:
        """The op table: label, function, module, output shape, params, FLOPs, time."""
        from .optable import text

        return text(self)

    def _repr_html_(self) -> str:
        from .optable import to_html

        return to_html(self)

    def to_pandas(self):
        """One pandas row per op (needs pandas: ``pip install pandas``)."""
        from .optable import to_pandas

        return to_pandas(self)

    # ---- values and files ---------------------------------------------------------------------
    def _on_value_read(self) -> None:
        self._reads.on_value_read()

    def run(self, input: Any, /, *, input_kwargs: dict | None = None, **options: Any) -> Trace:
        """Trace the same model again on a new real input with this trace's capture options
        (``save=`` / ``intervention_ready=`` given here override them).

        On an ``intervention_ready`` trace the model's state is checked against the baseline
        first; a changed model refuses ``state_changed`` naming what changed.
        """
        rerun = self._objects.get("rerun")
        if rerun is None:
            raise TorchLensError(
                "this trace holds no model (it was loaded from a file)", code="model_unavailable",
                teach=["tl.trace(model, x)  # trace the model itself"])
        return rerun(self, input, input_kwargs=input_kwargs, **options)

    def backward(self, target: Any = None, *, retain_graph: bool = False,
                 param_grads: bool = False):
        """One backward from ``target`` (a scalar tensor computed from ``trace.output``, a
        callable ``fn(output) -> scalar``, or an op label whose value is summed) to every site
        of ``save_grads=``, with ``grad_edits=`` applied on the way; then ``trace[site].grad``.
        The model's ``.grad`` fields are left alone unless ``param_grads=True``; a second
        backward needs ``retain_graph=True`` on the first. Returns ``trace.grads``."""
        return lookup("backward")(self, target, retain_graph=retain_graph, param_grads=param_grads)

    @property
    def grads(self):
        """The gradients ``trace.backward`` computed: label, module, shape, norm, max abs."""
        return lookup("grads")(self)

    def push(self, edits: Any, *, allow_unfired: bool = False) -> Trace:
        """A new trace with ``edits`` applied, recomputing only the ops downstream of them from
        the recorded calls (no ``forward``). Needs ``tl.trace(model, x, save="all",
        intervention_ready=True)``; refuses ``push_unsafe`` where the graph itself could
        change (a downstream value decided Python control flow, or a value-dependent shape)."""
        return lookup("push")(self, edits, allow_unfired=allow_unfired)

    def decode_output(self, k: int = 5, labels: Any = None):
        """The output's meaning (next token, class label) for a gold trace; refuses otherwise."""
        from .semantics import decode

        return decode(self, k, labels)

    def output_table(self, k: int = 5, labels: Any = None) -> list[dict[str, Any]]:
        """The top-k of the output with probabilities: labels when a plugin or ``labels=`` gives
        them, class indices for a plain classifier's (batch, classes) scores; gold traces only."""
        return self.decode_output(k, labels).rows

    def draw(self, *, collapse: str | int = "none", module: str | None = None,
             depth: int | None = None, theme: str = "light", direction: str = "TB",
             file_format: str | None = None, path: str | os.PathLike | None = None,
             open_viewer: bool = False, renderer: str | None = None,
             roll_recurrent: bool = False, fold: bool | None = None,
             node_budget: int | None = None, max_nodes: int | None = 2000,
             color: str | None = None, overlay: Any = None, backward: bool = False,
             **unknown: Any):
        """Render the graph through a renderer plugin; returns a detached ``tl.viz.Drawing``.

        ``collapse="none"`` by default here ("auto", "modules" or a module depth fold it);
        ``path="g.html"`` (or ``file_format="html"``) writes one interactive page.
        ``color="grad_norm"`` colours by gradient norm (after ``trace.backward``), ``overlay=``
        by your own number per op. ``backward=True`` draws the autograd graph the forward made
        (a ``save_grads=`` trace, before a backward frees it), each node in the module call of
        the forward op it belongs to. Every dial is documented on ``torchlens.viz.draw_trace``;
        an unknown keyword refuses typed.
        """
        if backward:
            return lookup("backward_trace")(self).draw(
                collapse=collapse, module=module, depth=depth, theme=theme, direction=direction,
                file_format=file_format, path=path, open_viewer=open_viewer, renderer=renderer,
                roll_recurrent=roll_recurrent, fold=fold, node_budget=node_budget,
                max_nodes=max_nodes, color=color, overlay=overlay, **unknown)
        return lookup("draw")(self, collapse=collapse, module=module, depth=depth, theme=theme,
                          direction=direction, file_format=file_format, path=path,
                          open_viewer=open_viewer, renderer=renderer,
                          roll_recurrent=roll_recurrent, fold=fold, node_budget=node_budget,
                          max_nodes=max_nodes, color=color, overlay=overlay, **unknown)

    def save(self, path) -> None:
        """Write this trace (metadata, provenance and saved activations) to one file."""
        from .tracefile import save_trace

        save_trace(self, path, SCHEMA_VERSION)


class _Reads:
    """What an op's value read needs from its trace (the provenance, a warned-once flag), held
    apart so that ops never point back at the trace: a dropped trace is freed at once."""

    __slots__ = ("provenance", "warned", "meta")

    def __init__(self, provenance: dict[str, Any], meta: dict[str, Any]):
        self.provenance, self.warned, self.meta = provenance, False, meta

    def edits_at(self, op: Op) -> list[dict[str, Any]]:
        """The fired edit rows (forward, then gradient) at ``op``: by label, or by position
        where the capture left the label to be read from the op list."""
        rows = []
        for key in ("edits", "grad_edits"):
            for row in ((self.meta or {}).get(key) or {}).get("fired", ()):
                if not row.get("fired", True):
                    continue
                label = row.get("label")
                if label == op.label or label is None and row.get("op_index") == op.index:
                    rows.append(row if label is not None else dict(row, label=op.label))
        return rows

    def on_value_read(self) -> None:
        """Called on every raw value read; the input ladder warns here for synthesized inputs.

        Once per trace object: the warning bypasses the per-line registry, so two traces read on
        one line warn twice, and the filter ``message="nongold_raw_value_read"`` still applies.
        """
        if self.warned or self.provenance.get("origin", "gold") == "gold":
            return
        self.warned = True
        import sys
        import warnings

        from .errors import TorchLensWarning

        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
            frame = frame.f_back  # the first frame outside trace.py: the caller's read
        warnings.warn_explicit(
            TorchLensWarning(
                "nongold_raw_value_read",
                f"this trace ran on {self.provenance.get('origin')} (synthesized) input values; "
                "activations are real measurements of a forward over random data. Pass a real "
                "input for data-meaningful values."),
            TorchLensWarning, frame.f_code.co_filename, frame.f_lineno,
            module=frame.f_globals.get("__name__"), registry=None,
            module_globals=frame.f_globals)


def _rebuild(node: Any, trace: Trace) -> Any:
    kind = node["type"]
    if kind == "tensor":
        op = trace[node["label"]]
        return op._value if op.saved else None
    if kind in ("tuple", "list"):
        items = [_rebuild(item, trace) for item in node["items"]]
        return tuple(items) if kind == "tuple" else items
    if kind == "dict":
        return {key: _rebuild(item, trace) for key, item in zip(node["keys"], node["items"])}
    if "value" in node:
        return node["value"]
    objects = trace._objects.get("output_values") or []
    if node.get("object") is not None and node["object"] < len(objects):
        return objects[node["object"]]
    return node.get("repr")  # a loaded trace: the object's repr
