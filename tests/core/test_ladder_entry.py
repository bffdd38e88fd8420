"""Issue 18, the ladder: a declared input consumed by no entry module that fixes its dtype refuses
``input_recipe_ambiguous`` before any forward; a dtype error on a synthesized input teaches
``InputSpec`` first."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.errors import TorchLensError
from torchlens.types import InputSpec

SPEC = "torchlens.types.InputSpec("


class RootTable(nn.Module):
    """The root forward indexes its own parameter table with the input, then a Linear: the
    Linear is the first layer, but it is not what consumes the input."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(10, 4))
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(self.table[x])


class BareTable(nn.Module):
    """No submodule at all: the forward is one lookup."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(10, 4))

    def forward(self, x):
        return self.table[x].sum(-1)


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rows = nn.Parameter(torch.randn(10, 4))

    def forward(self, x):
        return self.rows[x]


class OneHot(nn.Module):
    """A Linear entry fixes float statically, but the forward one-hot encodes the input first:
    the forward fails on a dtype, after the recipe was a static fact."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(10, 2)

    def forward(self, x):
        return self.fc(F.one_hot(x, 10).float())


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return x * self.w


@pytest.mark.parametrize("model", [RootTable(), BareTable(), nn.Sequential(Lookup(),
                                                                           nn.Linear(4, 2))],
                         ids=["root-table", "bare-table", "custom-first-layer"])
def test_no_entry_that_fixes_the_dtype_refuses_before_any_forward(model, count_forwards):
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model, input_shape=(2, 5))
    assert err.value.code == "input_recipe_ambiguous" and isinstance(err.value, ValueError)
    assert err.value.teach[0].startswith("torchlens.types.InputSpec(shape, dtype=..., low=...,"
                                         " high=...)")
    assert "table" in err.value.message
    assert calls.n == 0


def test_the_taught_inputspec_traces_the_table_model():
    model = RootTable().eval()
    spec = InputSpec((2, 5), dtype=torch.long, low=0, high=10)
    trace = tl.trace(model, input_shape=spec)
    slot = trace.provenance["slots"][0]
    assert (slot["recipe"], slot["dtype"], slot["high"]) == ("spec", "int64", 10)
    assert trace.outputs[0].shape == [2, 5, 2]


@pytest.mark.parametrize(("model", "shape", "why"), [
    (nn.Sequential(nn.Linear(8, 4), nn.ReLU()), (2, 8), "'0' (Linear)"),
    (nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()), (1, 3, 8, 8), "'0' (Conv2d)"),
    (nn.Sequential(nn.LSTM(4, 4, batch_first=True)), (1, 3, 4), "'0' (LSTM)"),
    (Scale(), (3, 2), "no parameter table"),
    (nn.ReLU(), (3, 2), "no parameter table"),
], ids=["linear", "conv", "lstm", "scalar-param", "param-free"])
def test_float_entries_still_give_floats_and_say_why(model, shape, why):
    trace = tl.trace(model.eval(), input_shape=shape, save=None)
    slot = trace.provenance["slots"][0]
    assert slot["recipe"] == "uniform_0_1" and slot["dtype"] == "float32"
    assert why in slot["source"]


def test_a_dtype_error_on_a_declared_input_teaches_inputspec_first():
    with pytest.raises(TorchLensError) as err:
        tl.trace(OneHot().eval(), input_shape=(1, 3))
    assert err.value.code == "forward_failed"
    assert err.value.teach[0].startswith("tl.trace(model, input_shape=" + SPEC + "(1, 3), dtype=")
    assert "real call" in err.value.teach[1]


def test_a_shape_error_on_a_declared_input_keeps_the_usual_teach():
    with pytest.raises(TorchLensError) as err:
        tl.trace(nn.Linear(4, 2), input_shape=(1, 3))
    assert err.value.code == "forward_failed"
    assert not any(SPEC in t for t in err.value.teach)
    assert "real call" in err.value.teach[0]


def test_a_dtype_error_on_inferred_inputs_teaches_inputspec_first():
    with pytest.raises(TorchLensError) as err:
        tl.trace(OneHot().eval())
    assert err.value.code == "input_inference_failed"
    assert any(r.get("dtype_error") for r in err.value.diary)
    assert err.value.teach[0].startswith('tl.trace(model, input_shape={"x": ' + SPEC)
