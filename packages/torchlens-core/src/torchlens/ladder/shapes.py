"""Parse ``input_shape=`` into slots, refusing every malformed form with ``input_shape_invalid``.

One flat positive-int tuple is one input; a sequence of them is several positional inputs; a
mapping binds forward keyword names. An InputSpec may stand in for any shape.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
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
    part: str = ""  # where it sits in input_shape= ("", "[1]", "['mask']"), for refusals


_INT_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.uint16,
               torch.uint32, torch.uint64)
_COMPLEX_DTYPES = (torch.complex64, torch.complex128)
_MAX_NUMEL = 2**62  # a synthesized tensor must be indexable; allocation limits are checked later


def _bad(part: str, value: Any, why: str) -> InputError:
    return InputError(f"input_shape{part} = {value!r}: {why}", code="input_shape_invalid",
                      teach=EXAMPLES)


def _is_dim(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _is_shape_like(v: Any) -> bool:
    return isinstance(v, (tuple, list, InputSpec, Mapping))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def synthesizable(dtype: Any) -> bool:
    """Dtypes TorchLens can draw values for: floating, complex64/128, bool and plain integers."""
    return isinstance(dtype, torch.dtype) and (
        dtype.is_floating_point or dtype in _COMPLEX_DTYPES or dtype == torch.bool
        or dtype in _INT_DTYPES)


def check_bounds(dtype: torch.dtype, low: Any, high: Any, where: str,
                 code: str = "input_shape_invalid") -> None:
    """Refuse bounds that cannot make values of ``dtype`` in ``[low, high)``."""
    why = None
    if dtype == torch.bool:
        if low is not None or high is not None:
            why = "a bool input takes no low=/high= (its values are 0 and 1)"
    elif not dtype.is_floating_point and not dtype.is_complex:
        info = torch.iinfo(dtype)
        if not all(isinstance(b, int) and not isinstance(b, bool) for b in (low, high)):
            why = f"an integer input ({str(dtype).removeprefix('torch.')}) needs integer low=/high="
        elif not (info.min <= low < high <= info.max + 1):
            why = f"integer bounds need {info.min} <= low < high <= {info.max + 1}"
    elif not (_is_number(low) and _is_number(high) and low < high):
        why = "floating bounds need finite numbers with low < high"
    else:
        info = torch.finfo(dtype)
        if not (info.min <= low and high <= info.max and math.isfinite(float(high) - low)):
            why = (f"{str(dtype).removeprefix('torch.')} holds values in [{info.min}, "
                   f"{info.max}]; the bounds must fit inside")
        else:
            lo = torch.tensor(low, dtype=dtype)  # the smallest value of dtype that is >= low
            if lo.item() < low:
                lo = torch.nextafter(lo, torch.tensor(math.inf, dtype=dtype))
            if not lo.item() < high:
                why = f"no {str(dtype).removeprefix('torch.')} value lies in [low, high)"
    if why:
        raise InputError(f"input_shape{where}: low={low!r}, high={high!r}: {why}", code=code,
                         teach=EXAMPLES)


def check_spec_bounds(dtype: torch.dtype, low: Any, high: Any, where: str,
                      code: str = "input_shape_invalid") -> None:
    """``check_bounds`` after an InputSpec's defaults: floats [0, 1), integers from 0 (an integer
    spec without ``high`` is left to the recipe, which refuses it as ambiguous)."""
    if dtype.is_floating_point or dtype.is_complex:
        low, high = (0.0 if low is None else low), (1.0 if high is None else high)
    elif dtype != torch.bool:
        low = 0 if low is None else low
    if dtype == torch.bool or high is not None:
        check_bounds(dtype, low, high, where, code)


def _check_shape(shape: Any, part: str) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)):
        raise _bad(part, shape, f"expected a tuple of positive ints or an InputSpec, not "
                   f"{type(shape).__name__}")
    if not shape:
        raise _bad(part, shape, "a shape needs at least one dimension")
    for i, d in enumerate(shape):
        if not _is_dim(d):
            why = ("dimensions must be positive" if isinstance(d, int) and not
                   isinstance(d, bool) else f"a dimension must be a positive int, not "
                   f"{type(d).__name__}")
            raise _bad(f"{part}[{i}]", d, why)
    if math.prod(shape) > _MAX_NUMEL:
        raise _bad(part, shape, f"{math.prod(shape)} elements is more than a tensor can hold")
    return tuple(shape)


def _spec(value: Any, part: str) -> InputSpec:
    if not isinstance(value, InputSpec):
        return InputSpec(_check_shape(value, part))
    shape = _check_shape(value.shape, part + ".shape")
    if value.dtype is not None and not synthesizable(value.dtype):
        raise _bad(part + ".dtype", value.dtype, "expected a floating, complex, bool or integer "
                   "torch.dtype (e.g. torch.long) or None")
    for name in ("low", "high"):
        bound = getattr(value, name)
        if bound is not None and not _is_number(bound):
            raise _bad(f"{part}.{name}", bound, "a bound must be a finite int or float")
    if value.low is not None and value.high is not None and not value.low < value.high:
        raise _bad(part, value, "InputSpec needs low < high")
    if value.dtype is not None:
        check_spec_bounds(value.dtype, value.low, value.high, part)
    return InputSpec(shape, value.dtype, value.low, value.high)


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
            slots.append(Slot(name, True, _spec(value, f"[{name!r}]"), f"[{name!r}]"))
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
        slots = [Slot(str(i), False, _spec(v, f"[{i}]"), f"[{i}]")
                 for i, v in enumerate(input_shape)]
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
