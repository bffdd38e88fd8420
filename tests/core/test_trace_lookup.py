"""Trace lookup by label, pass label, index and module address; iteration, repr, rows."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl
from tests.models.zoo import PURE_CASES


@pytest.fixture(scope="module")
def recurrent():
    model, x = PURE_CASES["recurrent"].build()
    return tl.trace(model, x)


def test_lookup_by_label_pass_label_and_index(recurrent):
    first = recurrent["linear_2"]
    assert recurrent["linear_2:1"] is first
    assert recurrent["linear_2:2"].pass_num == 2
    assert recurrent[0].kind == "input" and recurrent[-1].kind == "output"
    assert recurrent[first.index] is first
    assert recurrent[-len(recurrent)] is recurrent[0]


def test_lookup_by_module_address(recurrent):
    module = recurrent["cell"]
    assert isinstance(module, tl.Module) and module.type == "Linear"
    assert isinstance(recurrent["cell:3"], tl.ModuleCall)
    assert torch.equal(recurrent["readout"].out, recurrent[recurrent["readout"].calls[0]
                                                           .output_ops[0]].out)
    with pytest.raises(tl.TorchLensError) as err:
        _ = module.out  # ran three times: which one?
    assert err.value.code == "key_not_found" and "trace['cell:1'].out" in err.value.teach


def test_missing_keys_refuse_typed_with_suggestions(recurrent):
    with pytest.raises(KeyError) as err:
        recurrent["linear_22"]
    assert err.value.code == "key_not_found"
    assert any("linear_2" in t for t in err.value.teach)
    with pytest.raises(tl.TorchLensError) as err:
        recurrent[999]
    assert err.value.code == "key_not_found"
    with pytest.raises(TypeError):
        recurrent[1.5]
    assert "linear_2:3" in recurrent and "nope" not in recurrent


def test_iteration_repr_and_rows(recurrent):
    labels = [op.label for op in recurrent]
    assert labels[0] == "input_1" and labels[-1] == "output_1" and len(labels) == len(recurrent)
    text = repr(recurrent)
    assert "Recurrent" in text and "ops" in text and "input gold" in text
    assert repr(recurrent["linear_2:2"]).startswith("<Op linear_2:2: linear")
    rows = recurrent.rows()
    assert [r["label"] for r in rows] == labels
    assert all(isinstance(r, dict) and "out" not in r for r in rows)
    assert rows[1]["shape"] == list(recurrent[1].shape)
