"""Rung 2 forms: flat tuple, sequence of tuples, mapping of keyword names, InputSpec anywhere;
every malformed form refuses input_shape_invalid naming the exact bad part."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn

import torchlens as tl
from torchlens.errors import TorchLensError
from torchlens.ladder import resolve
from torchlens.types import InputSpec

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


class Scale(nn.Module):
    """Takes one tensor of any shape: ``forward(self, x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.w


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 2)
        self.b = nn.Linear(3, 2)

    def forward(self, a, b):
        return self.a(a) + self.b(b)


class Keyword(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 2)

    def forward(self, x, *, mask, bias=None):
        return self.fc(x) * mask


class Star(nn.Module):
    """``forward(*args, **kwargs)``: any number of positional or keyword tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, *args, **kwargs):
        return [t * self.w for t in list(args) + list(kwargs.values())]


def shapes_of(trace) -> dict[str, list[int]]:
    return {op.slot: op.shape for op in trace.inputs}


# ---- the forms ----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", [(3, 1, 5), [3, 1, 5], torch.Size([3, 1, 5])])
def test_flat_tuple_is_one_input_with_batch_exactly_as_written(form):
    """Spec: "One flat positive-integer tuple is one input shape (batch included exactly as
    written)." -- no batch dim is added or dropped."""
    trace = tl.trace(Scale(), input_shape=form)
    assert shapes_of(trace) == {"0": [3, 1, 5]}


@pytest.mark.filterwarnings("ignore:nongold_raw_value_read")
def test_sequence_of_tuples_is_several_positional_tensors():
    """Spec: "A sequence of shape tuples is several positional tensors." """
    trace = tl.trace(Pair(), input_shape=[(2, 4), (2, 3)])
    assert shapes_of(trace) == {"0": [2, 4], "1": [2, 3]}
    assert trace.output.shape == (2, 2)


def test_mapping_binds_forward_keyword_names():
    """Spec: "A mapping binds forward keyword names to shapes -- this is how multi-input models
    are reachable" (keyword-only parameters included)."""
    trace = tl.trace(Keyword(), input_shape={"x": (2, 6), "mask": (2, 1)})
    assert shapes_of(trace) == {"x": [2, 6], "mask": [2, 1]}
    assert [s["slot"] for s in trace.provenance["slots"]] == ["x", "mask"]
    assert all(s["keyword"] for s in trace.provenance["slots"])


def test_inputspec_stands_in_for_any_shape():
    """An InputSpec may stand in for any shape: alone, in a sequence, in a mapping."""
    spec = InputSpec((2, 4), dtype=torch.float64, low=-1.0, high=1.0)
    t = resolve(Scale(), input_shape=spec).args[0]
    assert t.shape == (2, 4) and t.dtype == torch.float64 and t.min() >= -1 and t.max() < 1
    a, b = resolve(Pair(), input_shape=[InputSpec([2, 4]), (2, 3)]).args
    assert a.shape == (2, 4) and b.shape == (2, 3)
    kw = resolve(Keyword(), input_shape={"x": (1, 6), "mask": InputSpec((1, 1), torch.bool)})
    assert kw.kwargs["mask"].dtype == torch.bool and kw.kwargs["x"].shape == (1, 6)


# ---- bad forms, each naming its bad part --------------------------------------------------------

BAD = [
    ((1, 0), Scale, "input_shape[1] = 0"),
    ((1, -3), Scale, "input_shape[1] = -3"),
    ((1, 8.0), Scale, "input_shape[1] = 8.0"),
    ((True, 8), Scale, "input_shape[0] = True"),
    (("1", 8), Scale, "input_shape[0] = '1'"),
    ((1, None), Scale, "input_shape[1] = None"),
    ("1, 8", Scale, "input_shape = '1, 8'"),
    (8, Scale, "input_shape = 8"),
    ((), Scale, "input_shape = ()"),
    ({}, Scale, "input_shape = {}"),
    ([(1, 8), 3], Scale, "input_shape[1] = 3"),
    ([[(1, 8)]], Scale, "input_shape[0][0] = (1, 8)"),
    ([(1, 8), {"x": (1,)}], Scale, "input_shape[1] = {"),
    ({"y": (1, 8)}, Scale, "input_shape['y']"),
    ({1: (1, 8)}, Scale, "input_shape[1]"),
    ({"x": (1, 2.5)}, Scale, "input_shape['x'][1] = 2.5"),
    ({"x": [(1, 2)]}, Scale, "input_shape['x'][0] = (1, 2)"),
    ([(1, 8), (1, 8)], Scale, "2 positional inputs"),
    ([(2, 4), (2, 3), (2, 1)], Pair, "3 positional inputs"),
    ((2, 4), Pair, "requires ['b']"),
    ((1, 6), Keyword, "requires ['mask']"),
    ({"mask": (1, 1)}, Keyword, "requires ['x']"),
    ((2**40, 2**40), Scale, "more than a tensor can hold"),
    (InputSpec((1, 0)), Scale, "input_shape.shape[1] = 0"),
    (InputSpec(5), Scale, "input_shape.shape = 5"),
    (InputSpec((1, 8), dtype="float32"), Scale, "input_shape.dtype = 'float32'"),
    (InputSpec((1, 8), dtype=torch.qint8), Scale, "input_shape.dtype"),
    (InputSpec((1, 8), low=1, high=0), Scale, "low < high"),
    (InputSpec((1, 8), low="a"), Scale, "input_shape.low = 'a'"),
    (InputSpec((1, 8), high=float("inf")), Scale, "input_shape.high = inf"),
    (InputSpec((1, 8), high=float("nan")), Scale, "input_shape.high = nan"),
    (InputSpec((1, 8), low=True), Scale, "input_shape.low = True"),
    (InputSpec((1, 8), dtype=torch.long, low=0.5, high=3), Scale, "integer low=/high="),
    (InputSpec((1, 8), dtype=torch.uint8, high=300), Scale, "high <= 256"),
    (InputSpec((1, 8), dtype=torch.bool, high=2), Scale, "bool input takes no low=/high="),
    (InputSpec((1, 8), dtype=torch.float32, low=2.0), Scale, "low=2.0, high=1.0"),
    (InputSpec((1, 8), low=2.0), Scale, "low=2.0, high=1.0"),
    ([(1, 8), InputSpec((1, 0))], Star, "input_shape[1].shape[1] = 0"),
]


@pytest.mark.parametrize(("value", "model_cls", "names"), BAD,
                         ids=[repr(b[0])[:40] for b in BAD])
def test_bad_form_refuses_input_shape_invalid_naming_the_bad_part(value, model_cls, names,
                                                                 count_forwards):
    """Spec (issue 3): "Bad forms (zero or negative dims, floats, strings, nested nonsense,
    keyword names the forward does not take, more positional slots than the forward accepts)
    refuse with input_shape_invalid, naming the exact bad part" -- before any forward."""
    model = model_cls()
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model, input_shape=value)
    assert err.value.code == "input_shape_invalid"
    assert names in err.value.message
    assert any("input_shape=" in t for t in err.value.teach)
    assert calls.n == 0


def test_integer_inputspec_without_high_is_ambiguous():
    """An integer InputSpec needs its exclusive upper bound: no silent vocabulary guess."""
    with pytest.raises(TorchLensError) as err:
        tl.trace(Scale(), input_shape=InputSpec((1, 4), dtype=torch.long))
    assert err.value.code == "input_recipe_ambiguous"
    assert "high=" in err.value.message


# ---- property tests -----------------------------------------------------------------------------

leaves = st.one_of(st.integers(-3, 6), st.floats(allow_nan=True), st.text(max_size=3),
                   st.none(), st.booleans(), st.sampled_from(["x", "y"]))
values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner),
                            st.lists(inner, max_size=4).map(tuple),
                            st.dictionaries(st.one_of(st.sampled_from(["x", "y"]), st.integers(),
                                                      st.text(max_size=2)), inner, max_size=3)),
    max_leaves=12,
)
good_dims = st.lists(st.integers(1, 4), min_size=1, max_size=3)
specs = st.builds(InputSpec, st.one_of(good_dims, st.lists(leaves, max_size=3), leaves))


def _corrupt(dims: list, where: int, leaf) -> list:
    dims = list(dims)
    dims[where % len(dims)] = leaf
    return dims


near_valid = st.one_of(
    good_dims.map(tuple), good_dims, good_dims.map(lambda d: [tuple(d)]),
    good_dims.map(lambda d: {"x": tuple(d)}),
    st.builds(_corrupt, good_dims, st.integers(0, 3), leaves).map(tuple),
    st.builds(_corrupt, good_dims, st.integers(0, 3), leaves).map(lambda d: {"x": d}),
    specs, specs.map(lambda v: [v]), specs.map(lambda v: {"x": v}),
    st.tuples(specs, leaves), st.tuples(good_dims.map(tuple), specs),
)


def _dims(v) -> tuple[int, ...] | None:
    ok = isinstance(v, (list, tuple)) and v and all(
        type(d) is int and d > 0 for d in v)
    return tuple(v) if ok else None


def _slot(v) -> tuple[int, ...] | None:
    return _dims(v.shape) if isinstance(v, InputSpec) else _dims(v)


def oracle(value) -> tuple[int, ...] | None:
    """The one shape ``Scale`` (forward(self, x)) must receive, or None when ``value`` is bad:
    a shape or InputSpec alone, as the only item of a sequence, or under the key "x"."""
    if isinstance(value, dict):
        return _slot(value["x"]) if list(value) == ["x"] else None
    if isinstance(value, InputSpec):
        return _slot(value)
    if isinstance(value, (list, tuple)):
        if _dims(value):
            return _dims(value)
        if len(value) == 1:
            return _slot(value[0])
    return None


@SETTINGS
@given(value=st.one_of(values, near_valid))
def test_property_malformed_values_always_typed_never_a_guess(value):
    """Property: an arbitrary value is either exactly one valid shape -- and then exactly that
    shape is synthesized -- or a TorchLensError (input_shape_invalid) with no forward run;
    never another exception, never a silent guess."""
    assume(value is not None)  # input_shape=None is "not given": the zero-argument rung
    model = Scale()
    expected = oracle(value)
    try:
        trace = tl.trace(model, input_shape=value, save=None)
    except TorchLensError as exc:
        assert expected is None, f"{value!r} is valid but refused: {exc}"
        assert exc.code == "input_shape_invalid"
        assert model.calls == 0
        return
    assert expected is not None, f"{value!r} is malformed but was accepted"
    assert model.calls == 1
    assert trace.inputs[0].shape == list(expected)
    assert trace.provenance["slots"][0]["shape"] == list(expected)


dims = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)


@SETTINGS
@given(shapes=st.lists(dims, min_size=1, max_size=3), as_mapping=st.booleans())
def test_property_valid_shapes_synthesize_exactly_that_shape(shapes, as_mapping):
    """Property: a valid sequence (or mapping) of shapes synthesizes exactly those shapes, in
    order, one tensor per slot."""
    if as_mapping:
        form = {f"k{i}": s for i, s in enumerate(shapes)}
        res = resolve(Star(), input_shape=form)
        got = [tuple(res.kwargs[k].shape) for k in form]
        assert res.args == ()
    else:
        res = resolve(Star(), input_shape=shapes)
        got = [tuple(t.shape) for t in res.args]
    assert got == shapes
    assert [tuple(s["shape"]) for s in res.provenance["slots"]] == shapes


bounds = st.one_of(st.none(), st.integers(-300, 300), st.floats(-1e3, 1e3),
                   st.floats(allow_nan=True), st.booleans(), st.just("1"))
dtypes = st.sampled_from([None, torch.float32, torch.float16, torch.bfloat16, torch.float64,
                          torch.long, torch.int8, torch.uint8, torch.bool, "float32", 3])


@SETTINGS
@given(shape=st.one_of(dims, st.just((0, 2)), st.just(5)), dtype=dtypes, low=bounds,
       high=bounds)
def test_property_inputspec_is_honored_exactly_or_refused_typed(shape, dtype, low, high):
    """Property: any InputSpec either synthesizes exactly its shape, dtype and [low, high)
    bounds, or refuses typed (input_shape_invalid / input_recipe_ambiguous)."""
    spec = InputSpec(shape, dtype=dtype, low=low, high=high)
    try:
        t = resolve(Scale(), input_shape=spec).args[0]
    except TorchLensError as exc:
        assert exc.code in ("input_shape_invalid", "input_recipe_ambiguous")
        return
    assert tuple(t.shape) == shape
    assert t.dtype == (dtype or torch.float32)
    if t.dtype != torch.bool:
        lo = 0 if low is None else low
        hi = (1 if t.dtype.is_floating_point else None) if high is None else high
        assert t.double().min().item() >= lo and t.double().max().item() < hi
