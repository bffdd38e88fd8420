"""trace.run, tl.record, tl.recording.dry_run and validation: the other surfaces of issue 8."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.graph_breakage import forget_producers
from tests.models.zoo import PURE_CASES


def test_run_reuses_capture_options_on_a_new_real_input():
    model, x = PURE_CASES["recurrent"].build()
    first = tl.trace(model, x, save=["linear_2"])
    again = first.run(x * 2)
    assert again is not first and again.provenance["origin"] == "gold"
    assert {op.label for op in again if op.saved} == {op.label for op in first if op.saved}
    with torch.no_grad():
        assert torch.allclose(again.output, model(x * 2))


def test_run_checks_the_state_baseline():
    model, x = PURE_CASES["mlp"].build()
    trace = tl.trace(model, x, intervention_ready=True)
    assert trace.run(x).meta["state_baseline"]["digest"] == trace.meta["state_baseline"]["digest"]
    with torch.no_grad():
        model[0].bias.add_(1.0)
    with pytest.raises(tl.TorchLensError) as err:
        trace.run(x)
    assert err.value.code == "state_changed" and "0.bias" in err.value.message
    assert "intervention_ready=True" in err.value.teach[0]


def test_run_on_a_loaded_trace_refuses(tmp_path):
    model, x = PURE_CASES["mlp"].build()
    tl.trace(model, x).save(tmp_path / "t.tl")
    with pytest.raises(tl.TorchLensError) as err:
        tl.load(tmp_path / "t.tl").run(x)
    assert err.value.code == "model_unavailable"


def test_record_one_input_and_an_iterable():
    model, x = PURE_CASES["recurrent"].build()
    full = tl.trace(model, x)
    single = tl.record(model, x, save=["linear_2", "readout"], progress=False)
    assert len(single) == 1 and torch.equal(single["linear_2"], full["linear_2"].out)
    assert torch.equal(single["readout"], full["readout"].out)
    batches = [x, x * 2, x * 3]
    rec = tl.record(model, batches, save=["cell"], progress=False)
    assert rec["cell"].shape[0] == 3 * x.shape[0]
    third = tl.trace(model, x * 3)
    assert torch.equal(rec["cell:3"][4:], third["cell:3"].out)


def test_record_progress_bar_switch(capsys):
    model, x = PURE_CASES["mlp"].build()
    tl.record(model, [x, x], save=["linear_1"], progress=True)
    assert "tl.record" in capsys.readouterr().err
    tl.record(model, [x, x], save=["linear_1"], progress=False)
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("case", ["dict_output", "multi_positional", "inplace"])
def test_record_keeps_inputs_and_outputs_by_their_trace_labels(case):
    """``input_N``/``output_N`` select what the full trace's input and output nodes hold."""
    model, x = PURE_CASES[case].build()
    full = tl.trace(model, x)
    labels = [op.label for op in full.inputs + full.outputs]
    rec = tl.record(model, x, save=labels, progress=False)
    assert rec.labels == labels
    for label in labels:
        assert torch.equal(rec[label], full[label].out), label
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(model, x, save=[f"output_{len(full.outputs) + 1}"], progress=False)
    assert err.value.code == "save_selection_invalid"


def test_record_refuses_unknown_selection():
    model, x = PURE_CASES["mlp"].build()
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(model, x, save=["nope_1"], progress=False)
    assert err.value.code == "save_selection_invalid"


def test_dry_run_lists_what_would_be_recorded_without_values():
    model, x = PURE_CASES["recurrent"].build()
    calls = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    rows = tl.recording.dry_run(model, x, save=["linear_2", "readout"])
    assert len(calls) == 1
    assert [r["label"] for r in rows] == ["linear_2", "linear_2:2", "linear_2:3", "linear_3"]
    assert all(r["bytes"] == 4 * torch.Size(r["shape"]).numel() for r in rows)


@pytest.mark.parametrize("name", sorted(PURE_CASES))
def test_forward_validation_passes_on_every_zoo_model(name):
    model, x = PURE_CASES[name].build()
    report = tl.validation.validate_forward_pass(model, x)
    assert report.passed, report.failed[:3]
    assert any(r["status"] == "passed" for r in report.rows)


@pytest.mark.parametrize("name", sorted(PURE_CASES))
def test_backward_validation_passes_on_every_zoo_model(name):
    model, x = PURE_CASES[name].build()
    report = tl.validation.validate_backward_pass(model, x)
    assert report.passed, report.failed[:3]
    assert report.worst is None or report.worst["max_abs_err"] < 1e-4


def test_validation_catches_a_broken_graph(monkeypatch):
    from torchlens import validation

    model, x = PURE_CASES["residual"].build()
    forget_producers(monkeypatch)
    assert not validation.validate_forward_pass(model, x).passed
    assert not validation.validate_backward_pass(model, x).passed


def test_backward_validation_refuses_without_a_differentiable_output():
    model = nn.Linear(3, 2).requires_grad_(False)
    with pytest.raises(tl.TorchLensError) as err:
        tl.validation.validate_backward_pass(model, torch.rand(1, 3))
    assert err.value.code == "no_differentiable_output"


@pytest.mark.parametrize("verb", ["validate_forward_pass", "validate_backward_pass"])
def test_validation_refusals_teach_the_validation_call(verb):
    """A refusal from the shared input checks names the command to run next, which for
    validation is ``tl.validation.<verb>``, not the module ``tl.validation``."""
    with pytest.raises(tl.TorchLensError) as err:
        getattr(tl.validation, verb)("not a model", torch.rand(1, 3))
    assert err.value.code == "model_invalid"
    assert err.value.teach == [f"tl.validation.{verb}(model, x)"]
    with pytest.raises(tl.TorchLensError) as err:
        getattr(tl.validation, verb)(nn.Linear(3, 2), torch.rand(1, 3), input_shape=(1, 3))
    assert err.value.code == "input_rung_conflict"
    assert all(line.startswith(f"tl.validation.{verb}(model, ") for line in err.value.teach)


def test_validation_leaves_the_model_as_it_was():
    model, x = PURE_CASES["dropout_train"].build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tl.validation.validate_backward_pass(model, x)
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def forward(self, x, mask=None):
        out = self.lin(x)
        return out if mask is None else out * mask


@pytest.mark.parametrize("verb", ["validate_forward_pass", "validate_backward_pass"])
def test_validation_takes_its_input_as_trace_does_and_teaches_without_one(verb):
    model, calls = Masked(), []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    validate = getattr(tl.validation, verb)
    x, mask = torch.rand(1, 3), torch.tensor([[1.0, 0.0]])
    report = validate(model, x, input_kwargs={"mask": mask})
    assert report.passed and "mul_1" in [row["label"] for row in report.rows]
    calls.clear()
    with pytest.raises(tl.TorchLensError) as err:
        validate(model)
    assert err.value.code == "input_inference_failed" and not calls
    assert err.value.teach[0] == f"tl.validation.{verb}(model, x)  # your real input (best)"
    with pytest.raises(TypeError):  # an unknown keyword is refused, not ignored
        validate(model, x, input_kwarg={"mask": mask})
