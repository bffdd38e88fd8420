"""The one door into a capture: ``capture(request, parts)``, and the protocol of a *part*.

Every capability that takes part in a capture (edits, the gradient observer, the step follower,
validation's replay, push's template keeper, and what comes next) is a part: an object with the
attributes and methods of ``Part`` below, handed to ``engine.capture`` in a list. The recorder
is never subclassed and its state never read behind its back: a part sees the capture through
the calls below, in this order, and through the ``Session`` it is given.

For one capture, ``engine.capture(request, parts)`` does::

    session = Session(request, state, inputs)    # the inputs are recorded first
    for part in parts: part.start(session)
    mode = leader.lead(recorder, session) or recorder   # at most one part leads
    with mode:                                   # the forward runs (or a runner runs it)
        ... out = part.op(out, label, base, pass_num, frame, func, args, kwargs, index, inplace)
        ... output = part.module(state, address, pass_num, args, output)
    for part in parts: part.end(session)         # session.failed says how it ended
    trace = leader.trace(session) or <the Trace built from the records>
    for part in parts: part.finish(trace, session)
    return trace

``op`` is called after an op ran, for the parts whose ``ops`` hold its base label
(``EVERY_OP``: every op), in list order, each getting the value the one before returned (edits
first, so observers see the edited value); a part that returns another value replaces the op's
output from then on. ``module`` is called as a module call returns, for the parts whose
``modules`` hold its address. ``needs`` names what the capture must keep for a part besides
its records: ``"templates"`` (each op's call, to replay it), ``"live"`` (each op's live output,
its version and output gradient: validation), ``"decisions"`` (the ops whose values a Python
decision read), ``"output"`` (the forward's live output, on ``session.output``). Read what was
kept with ``session.kept()``. A ``light`` part (``taps.Taps``) asks for a light capture: no op
records, only the values of ``request.save`` kept (``session.values``), and a Trace with no
ops.

A light capture's part may run the forward itself (``runs``; the compiled taps do, through
``torch.compile``): then no recorder and no module frame is installed; ``run(session)``
returns what the forward returned and leaves the kept values on ``session.values``, calling
the other parts' ``op`` and ``module`` as the recorder would (``Seams``); its ``trace`` may
give the capture's Trace.

A part that leads (``lead`` returns a torch function mode) sees every torch call of the
forward first, and hands the calls it does not keep to the recorder it was given
(``recorder.__torch_function__``) or has the recorder build their records
(``recorder.record_ran``); the step follower is one. When its ``trace(session)`` returns a
Trace, that is the capture's.

A part that holds values in parts across processes (the sharded gather) sets
``session.whole`` in ``start``: a part that computes from an op's arguments (a transformer
name's pattern from attention's q and k) reads them through ``whole_call(session, args,
kwargs)``, whole as the unsharded model would give them (keeping ``session.whole``, not the
session: a part holding the session that holds the part would be a reference cycle).

A worked part, counting the ReLUs of a forward and leaving the count on the trace::

    class CountRelus(Part):
        ops = EVERY_OP

        def __init__(self):
            self.count = 0

        def op(self, out, label, base, *rest):
            self.count += base.startswith("relu_")
            return out

        def finish(self, trace, session):
            trace.meta["relus"] = self.count

    trace = capture(CaptureRequest(model, (x,), {}, save=None), [CountRelus()])
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class _EveryOp:
    """``ops`` of a part that wants every op: contains every label, names none."""

    def __contains__(self, base: object) -> bool:
        return True

    def __iter__(self):
        return iter(())

    def __bool__(self) -> bool:
        return True


EVERY_OP = _EveryOp()


@dataclass
class CaptureRequest:
    """What one capture is asked for, as every surface assembles it: the model and its call,
    ``save=`` (as ``tl.trace``'s), the input's provenance, the model's inventory when the
    caller took it with no forward since, and two options: ``keep_output`` (what the forward
    returned, as it returned it, on ``trace._objects["forward_output"]``: a step's caller
    reads the logits and the cache) and ``frames`` (a ``boundaries.Kept`` whose module frames
    stay installed from one capture to the next, instead of frames installed for this one)."""

    model: Any
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    save: Any = "all"
    provenance: dict | None = None
    inventory: Any = None
    keep_output: bool = False
    frames: Any = None


class Session:
    """One capture in progress, as its parts see it: the request, the capture's state (the
    ``CaptureState`` the module hooks of ``module`` also get), the forward's input tensors in
    ``input_1, input_2, ...`` order, and once it ran, its live output (when a part ``needs``
    it) and whether it failed."""

    def __init__(self, request: CaptureRequest, state: Any, inputs: list):
        self.request, self.state, self.inputs = request, state, inputs
        self.output: Any = None
        self.failed = False
        self.calls: list = []  # the finished module calls' frames
        self.structure: Any = None  # the output's structure, once the forward returned
        self.capture_ns = 0  # how long the forward took, once it is over
        self.values: dict[str, Any] = {}  # a light capture's kept values, by label or address
        # set by a part holding values in parts across processes (the sharded gather): the
        # whole of a tensor an op was given, as the unsharded model would hold it
        self.whole: Any = None

    def kept(self) -> dict[str, Any]:
        """What the capture kept for ``needs``: the call templates (``calls``), autocast
        regions, dimension orders of transformed ops, decided ops, and with ``"live"`` the live
        outputs, their versions and output gradients."""
        s = self.state
        return {"calls": s.calls, "autocast": s.autocast, "orders": s.orders,
                "decided": s.decided, "live": s.live, "versions": s.versions, "grads": s.grads,
                "output": self.output}


def whole_call(whole: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """An op's arguments as the unsharded model would give them (``whole``: the capture's
    ``Session.whole``), for a part that computes from them (a pattern from attention's q and
    k); else as they are."""
    if whole is None:
        return args, kwargs
    return tuple(whole(a) for a in args), {k: whole(v) for k, v in kwargs.items()}


class Part:
    """The protocol of a part, with the default of each step: a part inherits it and
    overrides what it uses."""

    ops: Any = ()  # base labels (``relu_3``) whose ops ``op`` is called for, or EVERY_OP
    modules: Any = ()  # module addresses whose calls ``module`` is called for
    needs: frozenset[str] = frozenset()
    light = False  # a light capture's part: the capture keeps no records, only its values
    runs = False  # a light capture's part that runs the forward itself (``run``)

    def start(self, session: Session) -> None:
        """Before the forward runs (its inputs are recorded)."""

    def lead(self, recorder: Any, session: Session) -> Any:
        """The torch function mode that sees every call first, or None: the recorder's."""
        return None

    def op(self, out: Any, label: str, base: str, pass_num: int, frame: Any, func: str,
           args: tuple, kwargs: dict, index: int | None, inplace: bool) -> Any:
        """After an op of ``ops`` ran (on ``args`` and ``kwargs``): its value (the same object,
        or one to use instead)."""
        return out

    def module(self, state: Any, address: str, pass_num: int, args: tuple, output: Any) -> Any:
        """As a call of a module of ``modules`` returns: its output (or one to use instead)."""
        return output

    def run(self, session: Session, seam: Any) -> Any:
        """A runner's forward (``runs``): the model's output, with ``seam`` (the other parts'
        ``op`` and ``module``, or None) called where the recorder would call it."""
        raise NotImplementedError

    def end(self, session: Session) -> None:
        """The forward is over (``session.failed`` when it raised); no record is read yet."""

    def trace(self, session: Session) -> Any:
        """A leading part's (or a runner's) own Trace of the capture, or None: the one built
        from the records."""
        return None

    def finish(self, trace: Any, session: Session) -> None:
        """The Trace is built (a partial one when the forward failed): add what was kept, or
        refuse."""


class Seams:
    """Several parts on the recorder's op and module seam, called in order."""

    def __init__(self, parts: list[Any]):
        self.parts = parts
        if any(p.ops is EVERY_OP for p in parts):
            self.ops: Any = EVERY_OP
        else:
            self.ops = {base for p in parts for base in p.ops}
        self.modules = {address: None for p in parts for address in p.modules}

    def op(self, out: Any, label: str, base: str, *rest: Any) -> Any:
        for part in self.parts:
            if base in part.ops:
                out = part.op(out, label, base, *rest)
        return out

    def module(self, state: Any, address: str, pass_num: int, args: tuple, output: Any) -> Any:
        for part in self.parts:
            if address in part.modules:
                output = part.module(state, address, pass_num, args, output)
        return output


def combine(parts: list[Any]) -> Any:
    """The seam of these parts (those with ops or modules): None, the one, or ``Seams``."""
    present = [p for p in parts if p.ops or p.modules]
    if not present:
        return None
    return present[0] if len(present) == 1 else Seams(present)
