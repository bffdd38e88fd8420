"""Parse ``input_shape=`` into slots, refusing every malformed form with ``input_shape_invalid``.

One flat positive-int tuple is one input; a sequence of them is several positional inputs; a
mapping binds forward keyword names. An InputSpec may stand in for any shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..errors import InputError
from ..types import InputSpec
from .signature import ForwardSignature, forward_signature

EXAMPLES = [
    "tl.trace(model, input_shape=(1, 3, 224, 224))  # one input, batch as written",
    "tl.trace(model, input_shape=[(1, 4), (1, 3)])  # several positional inputs",
    'tl.trace(model, input_shape={"input_ids": (1, 16), "attention_mask": (1, 16)})',
    "tl.trace(model, input_shape=torchlens.types.InputSpec((1, 16), dtype=torch.long, low=0, "
    "high=100))",
]


@dataclass(frozen=True)
class Slot:
    """One synthesized input: positional index or keyword name, and its spec."""

    name: str  # "0", "1", ... for positionals; the keyword otherwise
    keyword: bool
    spec: InputSpec


def _bad(part: str, value: Any, why: str) -> InputError:
    return InputError(f"input_shape{part} = {value!r}: {why}", code="input_shape_invalid",
                      teach=EXAMPLES)


def _is_dim(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _is_shape_like(v: Any) -> bool:
    return isinstance(v, (tuple, list, InputSpec, Mapping))


def _spec(value: Any, part: str) -> InputSpec:
    if isinstance(value, InputSpec):
        shape = value.shape
        if not isinstance(shape, tuple) or not shape or not all(_is_dim(d) for d in shape):
            raise _bad(part + ".shape", shape, "an InputSpec shape must be a non-empty tuple of "
                       "positive ints")
        if value.low is not None and value.high is not None and not value.low < value.high:
            raise _bad(part, value, "InputSpec needs low < high")
        return value
    if isinstance(value, (tuple, list)) and value and all(_is_dim(d) for d in value):
        return InputSpec(tuple(value))
    if isinstance(value, (tuple, list)):
        if not value:
            raise _bad(part, value, "a shape needs at least one dimension")
        for i, d in enumerate(value):
            if not _is_dim(d):
                why = ("dimensions must be positive" if isinstance(d, int) and not
                       isinstance(d, bool) else f"a dimension must be a positive int, not "
                       f"{type(d).__name__}")
                raise _bad(f"{part}[{i}]", d, why)
    raise _bad(part, value, f"expected a tuple of positive ints or an InputSpec, not "
               f"{type(value).__name__}")


def parse_input_shape(input_shape: Any, model: nn.Module,
                      sig: ForwardSignature | None = None) -> list[Slot]:
    """The slots ``input_shape`` names, checked against the forward signature."""
    sig = sig or forward_signature(model)
    if isinstance(input_shape, Mapping):
        if not input_shape:
            raise _bad("", input_shape, "an empty mapping names no input")
        slots = []
        for name, value in input_shape.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise _bad(f"[{name!r}]", name, "mapping keys must be forward keyword names")
            if name not in sig.keyword and not sig.var_keyword:
                raise _bad(f"[{name!r}]", name, f"{type(model).__name__}.forward takes no "
                           f"keyword {name!r}; it takes {list(sig.keyword)}")
            slots.append(Slot(name, True, _spec(value, f"[{name!r}]")))
        given = {s.name for s in slots}
    elif isinstance(input_shape, InputSpec) or (
        isinstance(input_shape, (tuple, list)) and not any(_is_shape_like(v) for v in input_shape)
    ):
        slots = [Slot("0", False, _spec(input_shape, ""))]
        given = set(sig.positional[:1])
    elif isinstance(input_shape, Sequence) and not isinstance(input_shape, (str, bytes)):
        for i, v in enumerate(input_shape):
            if not _is_shape_like(v):
                raise _bad(f"[{i}]", v, "a sequence of shapes must hold only shape tuples or "
                           "InputSpecs")
        slots = [Slot(str(i), False, _spec(v, f"[{i}]")) for i, v in enumerate(input_shape)]
        given = set(sig.positional[: len(slots)])
    else:
        raise _bad("", input_shape, f"expected a shape tuple, a sequence of shapes or a mapping "
                   f"of keyword names to shapes, not {type(input_shape).__name__}")
    n_pos = sum(not s.keyword for s in slots)
    if n_pos > len(sig.positional) and not sig.var_positional:
        raise _bad("", input_shape, f"{n_pos} positional inputs, but "
                   f"{type(model).__name__}.forward takes {len(sig.positional)} "
                   f"({', '.join(sig.positional) or 'none'})")
    missing = [n for n in sig.required if n not in given]
    if missing:
        raise _bad("", input_shape, f"{type(model).__name__}.forward also requires "
                   f"{missing}; name every required input, e.g. input_shape="
                   f"{sig.spelled_mapping()}")
    return slots
