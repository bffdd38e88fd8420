"""Validate a capture against the model: replay every op from its saved parents (forward), and
back-propagate through the recorded graph alone and compare with autograd (backward).

Both run pinned (eval, restored state); a mismatch means the recorded graph is missing an edge,
a parameter or a constant.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.autograd.function import BackwardCFunction

from .capture.boundaries import leaves as tensors_in
from .capture.engine import capture
from .capture.inference import outside_inference_mode
from .capture.policy import pinned
from .capture.replay import RANDOM_FUNCS, autocast_of, fresh_first, op_refs, resolve_template
from .capture.seam import CaptureRequest, Part
from .capture.transforms import call_batched, in_front
from .errors import InputError, TorchLensError, first_line
from .ladder import ABSENT

# calls whose result comes from the forward's own autograd graph (``torch.func.grad`` makes
# one), or from forward-mode AD's dual numbers (``torch.func.jacfwd``'s): why each is not replayed
_GRAPH_FUNCS = {
    torch.autograd.grad: "differentiates the forward's own autograd graph, which saved values "
                         "do not carry",
    torch.autograd.backward: "differentiates the forward's own autograd graph, which saved "
                             "values do not carry",
    torch._make_dual: "a forward-mode AD dual number, which lives in its dual level only",
    torch._unpack_dual: "a forward-mode AD dual number, which lives in its dual level only",
}


class Replay(Part):
    """Validation's part: the capture keeps each op's call, live output, version and output
    gradient, to replay and compare."""

    needs = frozenset({"live"})

    def __init__(self) -> None:
        self.kept: dict[str, Any] = {}

    def finish(self, trace: Any, session: Any) -> None:
        """Take what the capture kept, to replay."""
        self.kept = session.kept()


@dataclass
class ValidationReport:
    """Per-op outcomes of a validation run, with the worst error."""

    kind: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)
    tolerance: dict[str, Any] = field(default_factory=dict)  # what "close" meant, and why

    @property
    def passed(self) -> bool:
        """True when every checked op agreed within the tolerance."""
        return all(r["status"] != "failed" for r in self.rows)

    @property
    def failed(self) -> list[dict[str, Any]]:
        """The rows of the ops that did not agree."""
        return [r for r in self.rows if r["status"] == "failed"]

    @property
    def worst(self) -> dict[str, Any] | None:
        """The row with the largest difference, or None when nothing was compared."""
        checked = [r for r in self.rows if r["max_abs_err"] is not None]
        return max(checked, key=lambda r: r["max_abs_err"]) if checked else None

    def __bool__(self) -> bool:
        return self.passed

    def skip(self, label: str, reason: str) -> None:
        """A row that is not compared, and why."""
        self.rows.append({"label": label, "status": "skipped", "max_abs_err": None,
                          "reason": reason})

    def __repr__(self) -> str:
        counts = {s: sum(r["status"] == s for r in self.rows) for s in ("passed", "failed",
                                                                          "skipped")}
        worst = self.worst
        tail = f", worst {worst['label']} {worst['max_abs_err']:.3g}" if worst else ""
        return (f"<{self.kind} validation: {'PASSED' if self.passed else 'FAILED'} "
                f"({counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} "
                f"skipped{tail})>")


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A sparse or nested value as the strided tensor the comparisons take."""
    if t.is_nested:
        return t.to_padded_tensor(0)
    return t.to_dense() if t.layout != torch.strided else t


def _unsparse(t: torch.Tensor) -> torch.Tensor:
    """A sparse gradient as a strided one, which gradients of other paths can be added to."""
    return t.to_dense() if t.layout in (torch.sparse_coo, torch.sparse_csr) else t


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    if not (a.is_floating_point() or a.is_complex()):
        return 0.0 if torch.equal(a, b) else float("inf")
    return float((a.detach().double() - b.detach().double()).abs().max()) if a.numel() else 0.0


def _capture(model, x, input_kwargs, input_shape, verb: str, grad: bool, options: dict):
    from .capture.entry import checked_inventory, input_options, resolve_for
    from .capture.meta import refuse_values

    surface = f"validation.{verb}"  # teaches name tl.validation.validate_forward_pass(...)
    inv = checked_inventory(model, surface)
    refuse_values(model, surface, "a replay of saved values", inv)
    if x is ABSENT and input_shape is None and not input_kwargs:
        # a replay compares values a real call saved: nothing is probed for it
        raise InputError(
            f"tl.validation.{verb} needs an input: it replays the values a capture of one call "
            "saved", code="input_inference_failed",
            teach=[f"tl.validation.{verb}(model, x)  # your real input (best)",
                   f"tl.validation.{verb}(model, input_shape=(1, 3, 224, 224))  # or its shape",
                   "tl.debug.guess_input_shape(model)  # to find a shape that runs"])
    res = resolve_for(model, x, input_kwargs=input_kwargs, input_shape=input_shape,
                      surface=surface, options=input_options(**options), probe=None, inv=inv)
    replay = Replay()
    with pinned(model, surface, grad=grad, inv=res.inventory):
        result = capture(CaptureRequest(model, res.args, res.kwargs, save="all",
                                        inventory=res.inventory), [replay])
    result.provenance = res.provenance
    return result, replay.kept


@outside_inference_mode
def validate_forward_pass(model: nn.Module, x: Any = ABSENT, /, *,
                          input_kwargs: dict | None = None, input_shape: Any = None,
                          rtol: float = 1e-5, atol: float = 1e-6, tokenizer: Any = None,
                          processor: Any = None, preprocess: Any = None) -> ValidationReport:
    """Replay every op from its saved parents and compare with its saved output. The input is
    taken as ``tl.trace`` takes it."""
    trace, kept = _capture(model, x, input_kwargs, input_shape, "validate_forward_pass", False,
                     {"tokenizer": tokenizer, "processor": processor, "preprocess": preprocess})
    calls, casts, orders = (kept[k] for k in ("calls", "autocast", "orders"))
    saved = {op.index: op._value for op in trace.ops if op.saved}
    report = ValidationReport("forward", provenance=trace.provenance)
    with torch.no_grad():
        for op in trace.ops:
            if op.kind != "op":
                continue
            if op.func in RANDOM_FUNCS:
                report.skip(op.label, "nondeterministic")
                continue
            func, args, kwargs = calls[op.index]
            if func in _GRAPH_FUNCS:
                report.skip(op.label, _GRAPH_FUNCS[func])
                continue
            args = resolve_template(args, trace, model, saved)
            kwargs = resolve_template(kwargs, trace, model, saved)
            args = fresh_first(op, args)
            try:
                with autocast_of(casts.get(op.index)):
                    out = call_batched(func, args, kwargs)
            except RuntimeError as exc:
                if op.index not in orders:
                    raise
                # inside a transform that vmap alone does not rebuild (jacfwd's dual numbers)
                report.skip(op.label, "needs the functorch transform it ran in: "
                            + first_line(exc, 120))
                continue
            got = [_dense(t) for t in _tensors(out)]
            expected = [_dense(t) for t in _tensors(op._value)]
            errs = [_err(g, e) for g, e in zip(got, expected)]
            worst = max(errs) if errs else 0.0
            ok = len(got) == len(expected) and all(
                g.shape == e.shape and g.dtype == e.dtype and (torch.equal(g, e) or (
                    g.is_floating_point() and torch.allclose(g, e, rtol=rtol, atol=atol)))
                for g, e in zip(got, expected))
            report.rows.append({"label": op.label, "status": "passed" if ok else "failed",
                                "reason": None if ok else "replayed value differs",
                                "max_abs_err": worst})
    return report


@outside_inference_mode
def validate_backward_pass(model: nn.Module, x: Any = ABSENT, /, *,
                           input_kwargs: dict | None = None, input_shape: Any = None,
                           rtol: float | None = None, atol: float | None = None,
                           tokenizer: Any = None, processor: Any = None,
                           preprocess: Any = None) -> ValidationReport:
    """Back-propagate through the recorded graph op by op and compare every op's output
    gradient with ``torch.autograd.grad`` on the live forward. The input is taken as
    ``tl.trace`` takes it. Gradients are sums whose order differs from autograd's: with ops in
    bfloat16 or float16 they are compared by norm, ``|got - ref| <= atol + rtol * |ref|``, at
    that dtype's default tolerance (``report.tolerance`` says which); else element by element,
    by default at ``rtol=1e-4, atol=1e-6``."""
    trace, kept = _capture(model, x, input_kwargs, input_shape, "validate_backward_pass", True,
                     {"tokenizer": tokenizer, "processor": processor, "preprocess": preprocess})
    live = kept["live"]
    outputs = [t for t in tensors_in(kept["output"], []) if t.requires_grad
               and (t.is_floating_point() or t.is_complex())]
    if not outputs:
        raise TorchLensError(
            f"{type(model).__name__}'s output has no differentiable tensor (nothing requires "
            "grad), so there is no backward pass to validate", code="no_differentiable_output",
            teach=["model.requires_grad_(True)  # if its parameters were frozen",
                   "tl.validation.validate_forward_pass(model, x)"])
    loss = sum(t.float().sum() for t in outputs)
    targets = [(op, pos, t) for op in trace.ops if op.kind == "op"
               for pos, t in enumerate(_tensors(live.get(op.index))) if t.requires_grad]
    leaves = [p for p in model.parameters() if p.requires_grad]  # run the whole graph
    try:
        computed = torch.autograd.grad(loss, [t for _, _, t in targets] + leaves,
                                       allow_unused=True, retain_graph=True)[: len(targets)]
    except RuntimeError as exc:  # the model's own backward breaks (an in-place write it needs)
        if "use_reentrant" in str(exc):
            raise _reentrant(model) from exc
        computed = torch.autograd.grad(loss, [t for _, _, t in targets], allow_unused=True,
                                       retain_graph=True)
    # a tensor hook sees the gradient of the value as the op produced it, also when a later
    # in-place op rebased the tensor; plain autograd.grad only sees the final version
    hooked = kept["grads"]
    reference = [hooked.get((op.index, pos), g) for (op, pos, _), g in zip(targets, computed)]
    ours, blocked = _graph_grads(trace, kept, model, live, outputs)
    tolerance = _grad_tolerance(trace, rtol, atol)
    rtol, atol, by_norm = tolerance["rtol"], tolerance["atol"], tolerance["measure"] == "norm"
    report = ValidationReport("backward", provenance=trace.provenance, tolerance=tolerance)
    versions, orders = kept["versions"], kept["orders"]
    # tensors several ops returned (``x.to(x.dtype)`` returns ``x``): autograd has one gradient
    # for the tensor, from all its reads, where the recorded graph gives each op its own reads
    reads = Counter(id(t) for _, _, t in targets)
    shared = {key for key, n in reads.items() if n > 1}
    for (op, pos, t), ref in zip(targets, reference):
        got = ours.get((op.index, pos))
        if op.index in orders:  # a real tensor under vmap: its value has the vmapped dims first
            t = in_front(t, orders[op.index][pos])
            ref = None if ref is None else in_front(ref, orders[op.index][pos])
        label = op.label if pos == 0 else f"{op.label}[{pos}]"
        if op.inplace and t._is_view():
            report.skip(label, "in-place write through a view: autograd rebases the view onto "
                               "its base")
            continue
        if (op.index, pos) not in hooked and t._version != versions[(op.index, pos)]:
            report.skip(label, "written in place later; autograd keeps no gradient for the "
                               "value this op produced")
            continue
        if ref is None and got is None:
            report.skip(label, "no gradient reaches it")
            continue
        ref = torch.zeros_like(t) if ref is None else ref
        got = torch.zeros_like(ref) if got is None else got.to(ref.dtype)
        got, ref = _dense(got), _dense(ref)
        ok = got.shape == ref.shape and (
            float((got.double() - ref.double()).norm()) <= atol + rtol * float(
                ref.double().norm())
            if by_norm else torch.allclose(got, ref, rtol=rtol, atol=atol))
        if not ok:  # a difference that is not the replay's when the reference is not the op's
            if op.index in blocked:
                reason = f"part of its gradient passes through {blocked[op.index]}, which a " \
                         "replay of saved values cannot follow"
            elif id(t) in shared:
                reason = "another op returned this same tensor: autograd's gradient is the " \
                         "tensor's, from all their reads"
            elif t._is_view() and t._version != versions[(op.index, pos)]:
                # its hook sees only the reads made before the write: autograd sends the
                # gradient of what was read after it through the base (whose row checks it)
                reason = "a view written in place later: autograd sends the gradient of its " \
                         "later reads through its base"
            else:
                reason = None
            if reason is not None:
                report.skip(label, reason)
                continue
        report.rows.append({"label": label, "status": "passed" if ok else "failed",
                            "reason": None if ok else "gradient differs from autograd",
                            "max_abs_err": _err(got, ref)})
    return report


# default gradient tolerances where ops ran in a half-precision dtype: a sum's rounding there
# is about the dtype's epsilon per add (bfloat16 3.9e-3, float16 4.9e-4), and a cancelling
# reduction (a norm's variance) makes single elements meaningless, so the norm is compared
_HALF_RTOL = {"bfloat16": 5e-2, "float16": 1e-2}


def _grad_tolerance(trace, rtol: float | None, atol: float | None) -> dict[str, Any]:
    """How backward validation compares: element by element, or by norm when the forward ran
    ops in a half-precision dtype (the least precise one sets the default)."""
    dtypes = {op.dtype for op in trace.ops if op.kind == "op"}
    half = next((d for d in _HALF_RTOL if d in dtypes), None)
    if half is None:
        return {"measure": "elementwise", "rtol": 1e-4 if rtol is None else rtol,
                "atol": 1e-6 if atol is None else atol}
    return {"measure": "norm", "rtol": _HALF_RTOL[half] if rtol is None else rtol,
            "atol": 1e-5 if atol is None else atol,
            "why": f"ops ran in {half}: autograd and the replay round their sums differently"}


def _graph_grads(trace, kept, model, live, outputs
                 ) -> tuple[dict[tuple[int, int], torch.Tensor], dict[int, str]]:
    """Gradients of sum(outputs) w.r.t. every op output using only the recorded graph: each op
    is replayed on detached copies of its parents' saved values and its vector-Jacobian product
    is sent along the recorded edges. Also returns the ops upstream of one whose gradient the
    replay cannot follow (an ``autograd.grad`` call, an op only its transform can run), each
    with that op's label."""
    saved = {op.index: op._value for op in trace.ops if op.saved}
    where = {id(t): (i, pos) for i, v in live.items() for pos, t in enumerate(_tensors(v))}
    calls, orders, casts = kept["calls"], kept["orders"], kept["autocast"]
    made_by = None  # (grad_fn, output_nr) -> (op index, position), made on first use
    grads: dict[tuple[int, int], torch.Tensor] = {}
    blocked: dict[int, str] = {}
    by_label = {o.label: o for o in trace.ops}
    for t in outputs:
        key = where.get(id(t))
        if key is not None:
            ones = torch.ones_like(t)
            if key[0] in orders:
                ones = in_front(ones, orders[key[0]][key[1]])
            grads[key] = grads.get(key, 0) + ones
    for op in reversed([o for o in trace.ops if o.kind == "op"]):
        wanted = {pos: g for (i, pos), g in grads.items() if i == op.index}
        if not wanted or op.func in RANDOM_FUNCS:
            continue
        func, args_t, kwargs_t = calls[op.index]
        if func in _GRAPH_FUNCS:
            _upstream(op, by_label, blocked)
            continue
        outs = _tensors(live.get(op.index))
        if outs and isinstance(outs[0].grad_fn, BackwardCFunction):
            # a custom autograd.Function's output: its own backward, not the ops recorded inside
            # its forward, sends the gradient on; asked of it on the live graph
            if made_by is None:
                made_by = {(t.grad_fn, t.output_nr): key for key, t in (
                    ((i, pos), t) for i, v in live.items() for pos, t in enumerate(_tensors(v)))
                    if t.grad_fn is not None}
            _through_function(outs, wanted, made_by, live, grads)
            continue
        leaves: dict[tuple[int, int], torch.Tensor] = {}
        parents: dict[int, Any] = {}
        for i in op_refs(args_t) | op_refs(kwargs_t):
            values = _tensors(saved[i])
            made = []
            for pos, v in enumerate(values):
                leaf = v.detach().requires_grad_(v.is_floating_point() or v.is_complex())
                leaves[(i, pos)] = leaf
                made.append(leaf)
            parents[i] = tuple(made) if isinstance(saved[i], tuple) else made[0]
        with torch.enable_grad(), autocast_of(casts.get(op.index)):
            args = resolve_template(args_t, trace, model, parents)
            kwargs = resolve_template(kwargs_t, trace, model, parents)
            args = fresh_first(op, args)
            try:
                out = call_batched(func, args, kwargs)
            except RuntimeError:
                if op.index not in orders:
                    raise
                _upstream(op, by_label, blocked)  # only its functorch transform can run it
                continue
            outs = _tensors(out)
            pairs = [(outs[pos], g) for pos, g in wanted.items()
                     if pos < len(outs) and outs[pos].requires_grad]
            inputs = [(k, t) for k, t in leaves.items() if t.requires_grad]
            if not pairs or not inputs:
                continue
            got = torch.autograd.grad([o for o, _ in pairs], [t for _, t in inputs],
                                      [g.to(o.dtype) for o, g in pairs], allow_unused=True)
        for (key, _), g in zip(inputs, got):
            if g is not None:
                grads[key] = grads.get(key, 0) + _unsparse(g)
    return grads, blocked


def _upstream(op, ops: dict[str, Any], blocked: dict[int, str]) -> None:
    """Mark every op ``op`` reads from, directly or not, as cut off by ``op``."""
    todo = list(op.parents)
    while todo:
        parent = ops[todo.pop()]
        if parent.index not in blocked:
            blocked[parent.index] = op.label
            todo.extend(parent.parents)


def _reentrant(model: nn.Module) -> TorchLensError:
    return TorchLensError(
        f"{type(model).__name__}'s forward checkpoints activations with use_reentrant=True, "
        "whose backward torch.autograd.grad cannot run, so there are no reference gradients",
        code="reentrant_checkpoint",
        teach=["torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)",
               "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs="
               "{'use_reentrant': False})  # Hugging Face models"])


def _through_function(outs, wanted, made_by, live, grads) -> None:
    """Send an autograd.Function output's gradients to the op outputs it was applied to."""
    pairs = [(outs[pos], g) for pos, g in wanted.items()
             if pos < len(outs) and outs[pos].requires_grad]
    inputs = [made_by[edge] for edge in pairs[0][0].grad_fn.next_functions if edge in made_by] \
        if pairs else []
    if not inputs:
        return
    targets = [_tensors(live[i])[pos] for i, pos in inputs]
    got = torch.autograd.grad([o for o, _ in pairs], targets, [g.to(o.dtype) for o, g in pairs],
                              allow_unused=True, retain_graph=True)
    for key, g in zip(inputs, got):
        if g is not None:
            grads[key] = grads.get(key, 0) + _unsparse(g)
