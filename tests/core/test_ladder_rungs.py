"""The three rungs: a real input XOR input_shape= XOR nothing, each failing typed, never twice."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import TorchLensError
from torchlens.ladder import MAX_PROBES


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x, scale=None):
        y = self.fc(x)
        return y * scale if scale is not None else y


class AlwaysFails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        raise RuntimeError("this forward never runs")


class NoFacts(nn.Module):
    """No parameterized layer: nothing static to infer a shape from."""

    def forward(self, x):
        return x.relu()


# ---- exclusive by law ---------------------------------------------------------------------------


@pytest.mark.parametrize("given", ["real", "input_kwargs", "both"])
def test_mixing_rungs_refuses_input_rung_conflict_before_any_forward(given, count_forwards):
    """Spec: "Mixing them refuses with a typed error (input_rung_conflict) before any forward
    runs." -- a real input or input_kwargs together with input_shape=."""
    model = Net()
    calls = count_forwards(model)
    args = (torch.rand(1, 8),) if given in ("real", "both") else ()
    kwargs = {"input_kwargs": {"scale": torch.ones(1)}} if given != "real" else {}
    with pytest.raises(TorchLensError) as err:
        tl.trace(model, *args, input_shape=(1, 8), **kwargs)
    assert err.value.code == "input_rung_conflict"
    assert isinstance(err.value, ValueError)
    assert any("input_shape=" in t for t in err.value.teach)
    assert any("(model, x)" in t for t in err.value.teach)
    assert calls.n == 0


def test_each_rung_alone_is_accepted_and_named_in_provenance(count_forwards):
    """Spec: "a real input XOR input_shape= XOR nothing" -- each alone traces, and the record
    names its rung."""
    model = Net().eval()
    calls = count_forwards(model)
    assert tl.trace(model, torch.rand(1, 8)).provenance["origin"] == "gold"
    assert tl.trace(model, input_shape=(1, 8)).provenance["origin"] == "declared"
    assert tl.trace(model, save=None).provenance["origin"] == "inferred"
    assert calls.real == 3 and calls.fake == 1  # rung 3 checked its candidate on fake tensors


# ---- never guess twice --------------------------------------------------------------------------


def test_failed_explicit_shape_never_falls_through_to_inference(count_forwards):
    """Spec: "A failed explicit size never falls through to inference" -- the declared forward
    runs once and fails typed (forward_failed), naming the declared shape; no probe follows."""
    model = Net()
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model, input_shape=(1, 5))
    assert err.value.code == "forward_failed"
    assert "1×5" in err.value.message and "inference" in err.value.message
    assert isinstance(err.value.__cause__, RuntimeError)
    assert err.value.partial_trace is not None
    assert any("input_shape=" in t for t in err.value.teach)
    assert calls.n == 1


def test_malformed_explicit_shape_refuses_before_any_forward(count_forwards):
    """A malformed input_shape= is refused typed before any forward, never replaced by a guess."""
    model = Net()
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model, input_shape=(1, 0))
    assert err.value.code == "input_shape_invalid"
    assert calls.n == 0


def test_failed_inference_never_falls_through_to_a_stock_tensor(count_forwards):
    """Spec: "a failed inference never falls through to a stock tensor -- TorchLens does not
    guess twice." Every probe failed: refusal, and the forward ran once per failed probe."""
    model = AlwaysFails()
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model)
    assert err.value.code == "input_inference_failed"
    failed = [r for r in err.value.diary if r["outcome"] == "failed"]
    assert failed and calls.n == len(failed) <= MAX_PROBES
    assert all(r["outcome"] != "verified" for r in err.value.diary)


def test_no_static_facts_refuses_without_probing(count_forwards):
    """With no static fact to start from, inference refuses with zero forwards (no stock
    tensor such as (1, 3, 224, 224) is tried)."""
    model = NoFacts()
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model)
    assert err.value.code == "input_inference_failed"
    assert err.value.diary == [] and calls.n == 0


@pytest.mark.parametrize("call", [
    lambda f: tl.trace(f, input_shape=(1, 2)),
    lambda f: tl.trace(f, torch.ones(2), save=["linear_1"]),  # save= labels look inside it
    lambda f: tl.record(f, torch.ones(2), save=["linear_1"]),
    lambda f: tl.recording.dry_run(f, torch.ones(2), save=["linear_1"]),
], ids=["trace", "trace-labels", "record", "dry_run"])
def test_non_module_refuses_typed(call):
    with pytest.raises(TorchLensError) as err:
        call(lambda x: x)
    assert err.value.code == "model_invalid"
    assert err.value.teach


# ---- rung 1 -------------------------------------------------------------------------------------


def test_gold_is_caller_authoritative_and_guesses_nothing(count_forwards):
    """Spec: "Rung 1 (gold). Caller-authoritative: TorchLens guesses nothing." -- the input op
    holds exactly the caller's tensor; no seed, no recipe, no probes."""
    model = Net().eval()
    calls = count_forwards(model)
    x = torch.rand(3, 8)
    trace = tl.trace(model, x, input_kwargs={"scale": torch.full((1,), 2.0)})
    assert calls.n == 1
    assert torch.equal(trace.inputs[0].out, x)
    prov = trace.provenance
    assert prov["origin"] == "gold" and prov["strategy"] == "caller"
    assert prov["seed"] is None and prov["generator"] is None and prov["probe_diary"] == []
    assert [(s["slot"], s["shape"], s["recipe"]) for s in prov["slots"]] == [
        ("0", [3, 8], "caller"), ("scale", [1], "caller")]


def test_gold_does_not_certify_meaningful_data():
    """Spec: ""Gold" means the tool did not synthesize anything -- it does not certify that your
    data is meaningful." An all-zero tensor the caller passed is still gold."""
    trace = tl.trace(Net().eval(), torch.zeros(1, 8))
    assert trace.provenance["origin"] == "gold"
    assert trace.output_table(k=2, labels=list("abcd"))[0]["label"] in list("abcd")


def test_input_kwargs_alone_is_a_real_input(count_forwards):
    """input_kwargs= alone is the real call (rung 1), not inference."""
    model = Net().eval()
    calls = count_forwards(model)
    trace = tl.trace(model, input_kwargs={"x": torch.rand(2, 8)})
    assert trace.provenance["origin"] == "gold" and calls.n == 1
    assert trace.provenance["slots"][0]["slot"] == "x"


def test_a_failing_list_input_says_how_to_pass_one_list_argument():
    """torchlens#43: a list is positional args; the failure note shows the wrapped form."""
    import torch
    from torch import nn

    import torchlens as tl

    class TakesList(nn.Module):
        def forward(self, images):
            return torch.stack(images).sum()

    with pytest.raises(TypeError) as err:
        tl.trace(TakesList(), [torch.rand(2), torch.rand(2)])
    assert "tl.trace(model, (x,))" in " ".join(err.value.__notes__)
    trace = tl.trace(TakesList(), ([torch.rand(2), torch.rand(2)],))
    assert [op.slot for op in trace.inputs] == ["0[0]", "0[1]"]
