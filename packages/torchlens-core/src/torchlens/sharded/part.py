"""The sharded gather as a capture part: folds DTensor's plumbing, follows where each value's
shard lies, hands edits whole values, and makes every saved value whole when the forward ends.

``Sharded`` leads the capture (its torch function mode sees each call before the recorder):

- DTensor's redistribution plumbing (``from_local``/``to_local``'s ``view_as``, the
  ``wrap_tensor_autograd`` and ``wait_tensor`` of an AsyncCollectiveTensor) runs unrecorded,
  its output standing for its input's op, as a view would: the ops read as the unsharded
  model's. Collectives (``all_reduce``, ...) stay, as the communication they are.
- A DTensor passed to an op stands for the op that made its local tensor, and an op's DTensor
  output's local tensor for that op; where a plain tensor computed from shards lies in the
  whole is followed through the ops in between (``layout.infer``).
- When the forward ends, every saved value is made whole, on every rank, in op order (each a
  collective, so all ranks gather the same values in the same order): ``op.out`` is a plain
  whole tensor, ``op.local`` this rank's part as a DTensor, ``op.meta['sharded']`` its
  placement; the op's shape is the whole's.
- An edited site's value is gathered before the edit (edits address the whole tensor) and this
  rank's part taken back after it (``Resplit``, the part after the others).
- FSDP2's parameter all-gathers and reshards (its module hooks) run unrecorded, and its
  unsharded parameters keep their names.

Before the forward, the ranks compare what they were asked (the selection, the edits, the
input shapes): a difference refuses ``sharded_ranks_disagree`` on every rank instead of a hang.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import torch
from torch._C import DisableTorchFunction
from torch.nn import Parameter
from torch.overrides import TorchFunctionMode

from .. import capabilities
from ..capture.boundaries import leaves
from ..capture.naming import func_name
from ..capture.seam import Part, Session
from ..errors import CaptureError, InputError

# calls DTensor makes to move a value between its local and its distributed form
_PLUMBING = frozenset({"wrap_tensor_autograd", "wait_tensor"})
_COLLECTIVES = frozenset({"all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
                          "all_to_all_single", "broadcast", "all_reduce_coalesced",
                          "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced"})
_RANK_FAILED_TEACH = [
    "torch.distributed.init_process_group('gloo', timeout=datetime.timedelta(seconds=60))"
    "  # how long a rank waits for another",
    "tl.trace(model, x)  # on every rank, with the same input shapes, save= and edits=",
]


def sharded_model(model: Any, params: list | None = None) -> bool:
    """Whether ``model`` holds a DTensor parameter (tensor parallel, or FSDP2's shards);
    ``params``: its ``(name, parameter)`` list when the caller has it (no walk of the model)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    dist = torch.distributed
    if dtensor is None or not (dist.is_available() and dist.is_initialized()):
        return False  # no process group, so no mesh and no DTensor
    kind = dtensor.DTensor
    if params is not None:
        return any(type(p) is not Parameter and isinstance(p, kind) for _, p in params)
    return any(isinstance(p, kind) for p in model.parameters())


def sharding(model: Any) -> str | None:
    """How ``model`` is split across processes: ``"tensor"`` (DTensor parameters the forward
    computes with in parts, so every rank takes the same input), ``"data"`` (FSDP2's
    ``fully_shard`` on a one-dimensional mesh: each rank computes whole values of its own
    inputs), ``"both"`` (FSDP2 on a mesh of several dimensions), or None."""
    if not sharded_model(model):
        return None
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kind = getattr(fsdp, "FSDPModule", None) if fsdp is not None else None
    if kind is None or not any(isinstance(m, kind) for m in model.modules()):
        return "tensor"
    meshes = {p.device_mesh.ndim for p in model.parameters() if _is_dtensor(p)}
    return "data" if meshes == {1} else "both"


@capabilities.provide("sharded_join")
def join(model: Any, parts: list, params: list | None = None, same_inputs: bool = True
         ) -> list:
    """The parts of a capture of ``model``: with the sharded gather around the surface's parts
    when the model is sharded across processes, else the parts as they are.
    ``same_inputs=False``: each rank captures its own input (FSDP2 data parallel)."""
    if not sharded_model(model, params):
        return parts
    head = Sharded(model, parts, same_inputs)
    return [head, *parts, Resplit(head)]


class Sharded(Part):
    """The leading part of a capture of a model sharded across processes (module docstring)."""

    def __init__(self, model: Any, parts: list, same_inputs: bool = True):
        self.model, self.parts, self.same_inputs = model, parts, same_inputs
        edited = [p for p in parts if hasattr(p, "specs")]  # an edit plan
        self.plan = edited[0] if edited else None
        self.ops = set(self.plan.ops) if self.plan is not None else ()
        self.modules = set(self.plan.modules) if self.plan is not None else ()
        self.state: Any = None
        self.layouts: dict[int, tuple] = {}  # id of a plain local tensor -> (ref, layout)
        self.by_index: dict[int, Any] = {}  # op index -> layout (False: sharded, not followed)
        self.wrapped: dict[Any, Any] = {}  # func -> the same, its output's partial made plain
        self.internal: dict[int, Any] = {}  # id -> weakref of tensors only DTensor holds
        self.pending: dict[Any, tuple] = {}  # an edited site -> (original, its layout, made_by)
        self.locals: dict[int, Any] = {}
        self.communication: dict[int, str] = {}  # op index -> the collective it is
        self.paused = 0  # > 0 inside FSDP2's hooks
        self.refusal: Exception | None = None  # raised by the last part, once all have ended
        self.handles: list = []
        self.passing: list = []  # what FSDP2's hooks were given, by producing op

    # -- the capture ---------------------------------------------------------------------------
    def start(self, session: Session) -> None:
        self.state = session.state
        if any(getattr(p, "observer", None) is not None and getattr(p, "edits", None)
               for p in self.parts):  # a gradient edit's index would address this rank's part
            raise InputError(
                "grad_edits= on a model sharded across processes would address each rank's "
                "part of the gradient, not the whole; it is not supported yet",
                code="option_invalid",
                teach=["tl.trace(model, x, save_grads=[...]); trace.backward(target)  # whole "
                       "gradients, without grad_edits="])
        if session.state.light is not None:  # taps (compile=): values this part never sees
            raise InputError(
                "a light capture (compile=, taps) of a model sharded across processes would "
                "keep each rank's shards, not whole values; it is not supported yet",
                code="option_invalid",
                teach=["tl.trace(model, x, save=[...])  # without compile=: whole values"])
        self._agree(session)
        self._fsdp_hooks()
        session.whole = self.whole

    def lead(self, recorder: Any, session: Session) -> Any:
        return _Lead(self, recorder)

    def end(self, session: Session) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        if session.failed:  # no collective after a failure here: a peer may be inside one
            return  # of the model's, and would take ours for it
        try:
            self._agree_after()
            if self.refusal is None:
                self._whole()
        except RuntimeError as exc:
            if not communication_failed(exc):
                raise
            self.refusal = CaptureError(
                f"the ranks could not finish the sharded capture together: another rank "
                f"failed or stopped ({str(exc).splitlines()[0][:200]})",
                code="sharded_rank_failed", teach=_RANK_FAILED_TEACH)
            self.refusal.__cause__ = exc

    def _agree_after(self) -> None:
        """Before any value is gathered: the ranks ran the same ops and saved the same values
        (a forward that branched differently, or a rank that failed after its last
        collective, would pair one rank's gathers with another's values, or wait forever)."""
        import torch.distributed as dist

        from ..capture.record import field

        s = self.state
        mine = (len(s.records), sorted(s.values), sorted(self.communication.values()),
                [field.func(r) for r in s.records][-8:])
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, repr(mine))
        if len(set(everyone)) > 1:
            differ = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
            self.refusal = InputError(
                f"the ranks' forwards differed (ranks {differ} recorded other ops or values "
                "than rank 0: a branch on rank-dependent data, or a site one rank never "
                "reached); no value was gathered", code="sharded_ranks_disagree",
                teach=["tl.trace(model, x, save=..., edits=...)  # the same on every rank, "
                       "with a forward that runs the same ops on every rank"])

    def finish(self, trace: Any, session: Session) -> None:
        if session.failed or self.refusal is not None or not (
                self.by_index or self.locals or self.communication):
            return
        from .layout import placements_of

        ops = trace.ops
        for index, name in self.communication.items():
            ops[index].meta["communication"] = {"collective": name, "bytes": ops[index].nbytes}
        for index, layout in self.by_index.items():
            op = ops[index]
            if layout is False:
                op.meta["sharded"] = {"placement": "unknown", "local_shape": op.shape}
                continue
            recorded, shape = op.shape, list(layout[3])
            if _numel(recorded):  # a plain local tensor's record holds its part's bytes
                op.nbytes = op.nbytes // _numel(recorded) * _numel(shape)
            op.shape, op.out_shapes = shape, [shape]
            local_shape = list(shape)
            if layout[0] == "shard":
                local_shape[layout[1]] //= layout[2].size()
            op.meta["sharded"] = {"placement": [repr(p) for p in placements_of(layout)],
                                  "mesh": list(layout[2].shape), "local_shape": local_shape}
        for index, local in self.locals.items():
            ops[index]._local = local
        trace._objects.setdefault("grad_settlers", []).append(
            _WholeGrads(dict(self.by_index)))
        trace.meta["sharded"] = {"world_size": torch.distributed.get_world_size(),
                                 "rank": torch.distributed.get_rank(),
                                 "values": "whole: gathered on every rank when the forward "
                                           "ended"}

    # -- edits: the whole value before, this rank's part after ---------------------------------
    def op(self, out: Any, label: str, base: str, pass_num: int, frame: Any, func: str,
           args: tuple, kwargs: dict, index: int | None, inplace: bool) -> Any:
        from .layout import infer, whole_of

        layout = None if _is_dtensor(out) else infer(func, args, kwargs, out, self.layout_of)
        if not _is_dtensor(out) and not layout:
            return out
        with DisableTorchFunction():
            whole = whole_of(out, layout)
        self.pending[label] = (out, layout, None)
        return whole

    def module(self, state: Any, address: str, pass_num: int, args: tuple, output: Any) -> Any:
        gathered = self._gathered(output)
        if gathered is None:
            return output
        whole, layout = gathered
        self.pending[(address, pass_num)] = (output, layout, state.made_by(output))
        return whole

    def resplit(self, key: Any, value: Any) -> Any:
        """This rank's part of an edited whole ``value`` at the site ``key``."""
        from .layout import split

        if key not in self.pending:
            return value
        original, layout, made = self.pending.pop(key)
        with DisableTorchFunction():
            part = split(value, original, layout)
        if layout:
            self.layouts[id(part)] = (weakref.ref(part), layout)
        if made is not None:
            self.state.substitute(made[0], made[1], part)
            if _is_dtensor(part):
                self.state.register(part._local_tensor, made[0], made[1])
        return part

    def whole(self, value: Any) -> Any:
        """The whole of ``value``, a tensor an op was given mid-forward (a collective: the parts
        that ask run on every rank, for the same ops in the same order)."""
        gathered = self._gathered(value)
        return value if gathered is None else gathered[0]

    def _gathered(self, value: Any) -> tuple[Any, Any] | None:
        """(the whole of ``value``, its layout) for a DTensor or a followed local part; None for
        anything else, which is whole already."""
        from .layout import whole_of

        if not isinstance(value, torch.Tensor):
            return None
        layout = None if _is_dtensor(value) else self.layout_of(value)
        if not _is_dtensor(value) and not layout:
            return None
        with DisableTorchFunction():
            return whole_of(value, layout), layout

    # -- layouts -------------------------------------------------------------------------------
    def layout_of(self, t: Any) -> Any:
        """The layout of a plain local tensor, or None."""
        entry = self.layouts.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        return entry[1]

    def after(self, name: str, args: tuple, kwargs: dict, out: Any) -> None:
        """Note where the output of a recorded call lies in the whole."""
        from .layout import infer, of_dtensor

        main = out if isinstance(out, torch.Tensor) else next(
            (o for o in out if isinstance(o, torch.Tensor)), None) \
            if isinstance(out, (tuple, list)) else None
        if main is None:
            return
        made = self.state.made_by(main)
        if made is None:
            return
        if _is_dtensor(main):
            local = main._local_tensor
            self.state.register(local, made[0], made[1])
            self.internal[id(local)] = weakref.ref(local)
            layout = of_dtensor(main)
            if layout is not None:
                self.layouts[id(local)] = (weakref.ref(local), layout)
                self.by_index.setdefault(made[0], layout)
            return
        if name in _COLLECTIVES:  # communication: its value is what every rank holds
            self.communication[made[0]] = name
            return
        layout = infer(name, args, kwargs, main, self.layout_of)
        if layout is None:
            return
        if layout:
            self.layouts[id(main)] = (weakref.ref(main), layout)
        if made[1] == 0:
            self.by_index[made[0]] = layout

    def internal_arg(self, args: tuple, kwargs: dict) -> Any:
        """The first argument that is DTensor's own (a DTensor's local tensor, a collective's
        raw output), which the model's code never holds: a call on it is DTensor's plumbing."""
        if not self.internal:
            return None
        for a in (*args, *kwargs.values()):
            for t in a if isinstance(a, (tuple, list)) else (a,):
                ref = self.internal.get(id(t))
                if ref is not None and ref() is t:
                    return t
        return None

    def alias(self, out: Any, source: Any) -> None:
        """``out`` (plumbing's output) stands for ``source``'s op and lies where it lies."""
        s = self.state
        made = s.made_by(source)
        if made is None and _is_dtensor(source):
            made = s.made_by(source._local_tensor)
        if made is not None:
            s.register(out, made[0], made[1])
        layout = self.layout_of(source)
        if layout is not None:
            self.layouts[id(out)] = (weakref.ref(out), layout)

    def stand_in(self, args: tuple, kwargs: dict) -> None:
        """A DTensor argument no op returned stands for the op that made its local tensor; its
        placement says where that op's value lies."""
        from .layout import of_dtensor

        s = self.state
        found = False
        for a in (*args, *kwargs.values()):
            for t in a if isinstance(a, (tuple, list)) else (a,):
                if not _is_dtensor(t):
                    continue
                found = True
                if s.made_by(t) is not None or id(t) in s.param_ids:
                    continue
                local = t._local_tensor
                made = s.made_by(local)
                if made is None:
                    continue
                s.register(t, made[0], made[1])
                layout = of_dtensor(t)
                if layout is not None and self.layout_of(local) is None:
                    self.layouts[id(local)] = (weakref.ref(local), layout)
                    if made[1] == 0 and field_kind(s, made[0]) == "op":
                        self.by_index[made[0]] = layout
        return found

    def settled(self, func: Any, name: str) -> Any:
        """``func`` whose DTensor output, when its placement is a partial sum with a state of
        its own (a vocabulary-parallel embedding's mask), is the same sum as a plain partial
        one (the recorder's copy of it would spend the state the forward's reduction needs);
        a collective's output waited for, so what the recorder keeps is its value."""
        wrapped = self.wrapped.get(func)
        if wrapped is None:
            collective = name in _COLLECTIVES

            def wrapped(*args: Any, **kwargs: Any) -> Any:
                out = func(*args, **kwargs)
                if collective and isinstance(out, torch.Tensor):  # its value written before
                    torch.ops._c10d_functional.wait_tensor(out)  # the recorder keeps it
                return _plain_partial(out)

            wrapped.__name__ = name
            self.wrapped[func] = wrapped
        return wrapped

    # -- whole values --------------------------------------------------------------------------
    def _whole(self) -> None:
        """Every saved value made whole on every rank: the parts gathered together
        (``layout.gather_many``), in op order."""
        from torch.distributed.tensor import DTensor, Partial

        from .layout import gather_many, of_dtensor, placements_of, plain, whole_of

        s = self.state
        items: list = []  # (index, local part, layout, the value kept as op.local)
        with DisableTorchFunction():
            for index in sorted(s.values):
                value = s.values[index]
                layout = self.by_index.get(index)
                if isinstance(value, tuple):  # several outputs: each DTensor on its own
                    new = tuple(whole_of(v, None) if isinstance(v, torch.Tensor) else v
                                for v in value)
                    self._keep(index, new)
                elif not isinstance(value, torch.Tensor):
                    continue
                elif _is_dtensor(value):
                    placement = value.placements[0]
                    if isinstance(placement, Partial) and placement.reduce_op != "sum":
                        self._keep(index, whole_of(value, None))  # not a sum: on its own
                        self.locals[index] = value.detach()
                    else:
                        items.append((index, value._local_tensor, of_dtensor(value),
                                      value.detach()))
                elif layout:
                    items.append((index, value, layout, None))
                elif type(value) is not torch.Tensor:
                    self._keep(index, plain(value))
            wholes = gather_many([(local, layout) for _, local, layout, _ in items])
            for (index, local, layout, kept), new in zip(items, wholes):
                if kept is None and layout:
                    kept = DTensor.from_local(local.detach(), layout[2], placements_of(layout),
                                              run_check=False, shape=new.shape,
                                              stride=new.stride())
                if kept is not None:
                    self.locals[index] = kept
                self._keep(index, new)

    def _keep(self, index: int, new: Any) -> None:
        """``new`` is op ``index``'s saved value from now on."""
        s = self.state
        if s.held is not None:
            s.held.forget(index)
        s.values[index] = new.detach() if isinstance(new, torch.Tensor) else new

    # -- agreement and FSDP2 -------------------------------------------------------------------
    def _agree(self, session: Session) -> None:
        """Refuse on every rank when the ranks were asked different captures."""
        import torch.distributed as dist

        request = session.request
        mine = repr((request.save if isinstance(request.save, (str, type(None)))
                     else sorted(request.save),
                     self.plan.specs() if self.plan is not None else None,
                     [_digest(t) for t in session.inputs] if self.same_inputs else None))
        everyone: list = [None] * dist.get_world_size()
        try:
            dist.all_gather_object(everyone, mine)
        except RuntimeError as exc:
            raise CaptureError(f"the ranks could not agree on the capture: {exc}",
                               code="sharded_rank_failed", teach=_RANK_FAILED_TEACH) from exc
        if len(set(everyone)) > 1:
            differ = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
            raise InputError(
                f"the ranks were asked different captures (ranks {differ} differ from rank 0 "
                "in save=, edits= or the inputs); every rank runs the same capture of a "
                "sharded model", code="sharded_ranks_disagree",
                teach=["tl.trace(model, x, save=..., edits=...)  # the same on every rank"])

    def _fsdp_hooks(self) -> None:
        """FSDP2's all-gathers and reshards run unrecorded; its unsharded parameters keep their
        names."""
        fsdp = sys.modules.get("torch.distributed.fsdp")
        kind = getattr(fsdp, "FSDPModule", None) if fsdp is not None else None
        if kind is None:
            return
        for address, module in self.model.named_modules():
            if not isinstance(module, kind):
                continue
            prefix = f"{address}." if address else ""
            self.handles += [
                module.register_forward_pre_hook(self._pause, prepend=True),
                module.register_forward_pre_hook(_Resume(self, module, prefix)),
                module.register_forward_hook(self._pause_after, prepend=True),
                module.register_forward_hook(_Resume(self, None, prefix)),
            ]

    def _pause(self, module: Any, args: Any) -> None:
        self.paused += 1
        self.passing.append([self.state.made_by(t) for t in leaves(args, [])])

    def _pause_after(self, module: Any, args: Any, output: Any) -> None:
        self.paused += 1
        self.passing.append([self.state.made_by(t) for t in leaves(output, [])])


class _Resume:
    """The hook after FSDP2's own: recording resumes; the tensors its hook handed on (new
    autograd nodes of the same values) stand for the ones it was given, and before the
    forward the unsharded parameters are known by their names."""

    def __init__(self, part: Sharded, module: Any, prefix: str):
        self.part, self.module, self.prefix = part, module, prefix

    def __call__(self, module: Any, args: Any, output: Any = None) -> None:
        part = self.part
        state = part.state
        part.paused = max(0, part.paused - 1)
        given = part.passing.pop() if part.passing else []
        handed = leaves(args if self.module is not None else output, [])
        if len(handed) == len(given):
            for t, made in zip(handed, given):
                if made is not None and state.made_by(t) is None:
                    state.register(t, made[0], made[1])
        if self.module is not None:
            ids = state.param_ids
            for name, p in module.named_parameters():
                ids.setdefault(id(p), self.prefix + name)


class _WholeGrads:
    """After ``trace.backward`` (every rank runs it, so every rank gathers the same gradients
    in the same order): each sharded op's gradient whole, as ``op.grad`` reads it."""

    def __init__(self, by_index: dict):
        self.by_index = by_index

    def __call__(self, trace: Any) -> None:
        from .layout import whole_of

        with DisableTorchFunction():
            for op in trace.ops:
                grad = op._grad
                if not isinstance(grad, torch.Tensor):
                    continue
                layout = self.by_index.get(op.index)
                if _is_dtensor(grad) or layout:
                    op._grad = whole_of(grad, layout or None).detach()


class Resplit(Part):
    """The part after the others: at edited sites, this rank's part of the edited whole; once
    every part has finished, the refusal the ranks came to when the forward ended."""

    def __init__(self, head: Sharded):
        self.head, self.ops, self.modules = head, head.ops, head.modules

    def finish(self, trace: Any, session: Session) -> None:
        refusal, self.head.refusal = self.head.refusal, None
        if refusal is not None:
            raise refusal

    def op(self, out: Any, label: str, *rest: Any) -> Any:
        return self.head.resplit(label, out)

    def module(self, state: Any, address: str, pass_num: int, args: tuple, output: Any) -> Any:
        return self.head.resplit((address, pass_num), output)


class _Lead(TorchFunctionMode):
    """Sees each call of the forward before the recorder (``Sharded``'s docstring)."""

    def __init__(self, part: Sharded, recorder: Any):
        super().__init__()
        self.part, self.recorder = part, recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        part = self.part
        kwargs = kwargs or {}
        if part.paused:
            return func(*args, **kwargs)
        name = func_name(func)
        try:
            if (name == "view_as" and len(args) == 2 and args[0] is args[1]) or (
                    name in _PLUMBING and args):
                out = func(*args, **kwargs)
                part.alias(out, args[0])
                return out
            inner = part.internal_arg(args, kwargs) if name not in _COLLECTIVES else None
            if inner is not None and not _from_torch_distributed():  # (without grad,
                inner = None  # ``to_local()`` hands the model DTensor's own local tensor)
            if inner is not None:  # DTensor's own work on a local tensor (a redistribution's
                out = func(*args, **kwargs)  # mask, chunks and concatenation): plumbing
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(t, torch.Tensor) and t is not inner:
                        part.alias(t, inner)
                        part.internal[id(t)] = weakref.ref(t)
                return out
            if _on_meta(kwargs):  # a shape or stride worked out on the meta device
                return func(*args, **kwargs)
            if part.stand_in(args, kwargs) or name in _COLLECTIVES:
                func = part.settled(func, name)
            out = self.recorder.__torch_function__(func, types, args, kwargs)
            if name in _COLLECTIVES and isinstance(out, torch.Tensor):
                part.internal[id(out)] = weakref.ref(out)
        except RuntimeError as exc:
            if not communication_failed(exc):
                raise
            raise CaptureError(
                f"a collective of the sharded forward failed ({name}): another rank failed or "
                f"is not running this capture ({str(exc).splitlines()[0][:200]})",
                code="sharded_rank_failed", teach=_RANK_FAILED_TEACH) from exc
        part.after(name, args, kwargs, out)
        return out


_COMM_WORDS = ("gloo", "nccl", "Connection closed", "timed out", "Timed out", "Timeout")


def communication_failed(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective's failure (a peer gone, a timeout), not the model's."""
    dist_error = getattr(torch.distributed, "DistError", None)
    return (dist_error is not None and isinstance(exc, dist_error)) or any(
        word in str(exc) for word in _COMM_WORDS)


def _from_torch_distributed() -> bool:
    """Whether the call being handled comes from torch.distributed's own code (a
    redistribution), not the model's: the first caller outside torch's wrappers says."""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("torch.distributed"):
            return True
        if not module.startswith("torch.") and module != "torch":
            return False
        frame = frame.f_back
    return False


def _on_meta(kwargs: dict) -> bool:
    device = kwargs.get("device") if kwargs else None
    return device is not None and str(device) == "meta"


def _plain_partial(out: Any) -> Any:
    """``out``, or for a DTensor whose partial placement holds a mask (``_MaskPartial``), the
    masked local tensor as a plain partial sum."""
    placement = out.placements[0] if _is_dtensor(out) else None
    mask = getattr(placement, "mask_buffer", None)
    if mask is None or mask.data is None:
        return out
    from torch.distributed.tensor import DTensor, Partial

    local = out._local_tensor.clone()
    mask.apply_mask(local)
    return DTensor.from_local(local, out.device_mesh, [Partial(placement.reduce_op)],
                              run_check=False, shape=out.shape, stride=out.stride())


def _digest(t: torch.Tensor) -> tuple:
    """An input's shape and two sums of its values: ranks handed other inputs of one shape
    (each its own batch of a tensor-parallel model) tell apart without moving the input."""
    if t.is_meta or not t.numel():
        return tuple(t.shape), str(t.dtype)
    with torch.no_grad(), DisableTorchFunction():
        v = t.detach().to(torch.float64)
        weights = torch.arange(1, v.numel() + 1, dtype=torch.float64, device=v.device)
        sums = torch.stack([v.sum(), (v.reshape(-1) * weights).sum()]).tolist()
    return tuple(t.shape), str(t.dtype), *(float(f"{x:.9g}") for x in sums)


def _is_dtensor(t: Any) -> bool:
    return type(t).__name__ == "DTensor" and isinstance(t, torch.Tensor)


def _numel(shape: Any) -> int:
    n = 1
    for d in shape or ():
        n *= d or 0
    return n


def field_kind(state: Any, index: int) -> str:
    """Whether record ``index`` is an op (not an input or output)."""
    from ..capture.record import field

    return field.kind(state.records[index])
