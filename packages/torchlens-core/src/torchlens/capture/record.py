"""The op record: one per node of a capture (an op, an input or an output), in one named type.

The hot path stores raw facts (torch.Size, dtype and device objects, the module frame); labels,
strings and byte counts are derived once the forward is over (``engine``). ``parents`` is the
producer's index when there is one (most ops: one object less for the collector), else a list.
``label`` is None until then (set at the op only when a site names labels). ``out_shapes`` is
None for a single output; ``nbytes`` None means "numel of shape times dtype size"; ``flops``
holds, for a call with a FLOP formula (counted later), its weight parameter's name
(``flops.WEIGHT_ARG``) or else its argument shapes (inside ``torch.vmap``: the count itself);
None for other calls. Equal shapes are one object (``CaptureState.shapes``): every object a
record keeps is memory the rest of the forward runs through.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, NamedTuple


class OpRecord(NamedTuple):
    """One node of a capture, as the recorder keeps it while the forward runs: the fields and
    their order (the hot path builds a plain tuple in this order)."""

    func: str  # the function's name ("linear"); "input" / "output" for the ends
    frame: list  # the module call it ran in (``boundaries``' frame)
    parents: Any  # the producer's index, or a list of them
    params: tuple  # names of the parameters it read
    buffers: tuple  # names of the buffers it read
    shape: Any  # torch.Size of its (first) output
    dtype: Any
    device: Any
    out_shapes: list | None  # every output's shape, for an op of several
    nbytes: int | None
    inplace: bool
    is_view: bool
    flops: Any
    time_ns: int
    label: str | None
    kind: str  # "op", "input" or "output"
    slot: str | None  # an end's place in the forward's arguments or output


# The hot path stores each record as a plain tuple in ``OpRecord``'s field order (making the
# named type costs four times a tuple: about 0.35 us an op); ``field.<name>(record)`` reads one
# field of either, ``fields(...)`` several, ``replaced`` makes a changed copy.
field = OpRecord(*(itemgetter(i) for i in range(len(OpRecord._fields))))


def replaced(record: tuple, **changes: Any) -> OpRecord:
    """A copy of ``record`` with these fields changed."""
    return OpRecord._make(record)._replace(**changes)


def fields(*names: str) -> itemgetter:
    """A getter of these fields of a record, as one tuple (or the one value): the fast way to
    read the same fields of many records."""
    return itemgetter(*(OpRecord._fields.index(name) for name in names))
