"""Rung 3: bounded probes with a diary -- N allocation-free fake-tensor checks, then 1 verified
real capture -- and typed refusals."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import TorchLensError
from torchlens.ladder import MAX_PROBES, infer


class Fits8(nn.Module):
    """Conv1d + BatchNorm + Dropout whose head only fits length 8: the first core candidate
    (length 16) fails, the second (length 8) verifies."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 2, 3, padding=1)
        self.bn = nn.BatchNorm1d(2)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(2 * 8, 3)

    def forward(self, x):
        if torch._C._is_torch_function_mode_enabled():
            self.captured = True
        return self.fc(self.drop(self.bn(self.conv(x))).flatten(1))


class NeverFits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 2, 1)
        self.bn = nn.BatchNorm1d(2)

    def forward(self, x):
        y = self.bn(self.conv(x))
        raise ValueError(f"no size fits, got {tuple(y.shape)}")


class ImageAndTokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, image, tokens):
        return self.fc(image) + tokens


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def same_state(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    now = model.state_dict()
    return set(now) == set(before) and all(torch.equal(now[k], before[k]) for k in before)


# ---- the bound and the diary --------------------------------------------------------------------


def test_probe_bound_is_documented_and_enforced(register_plugin, count_forwards):
    """Spec: "Shape inference probes the model (bounded, ...)" -- at most MAX_PROBES forwards,
    failed or not, even when plugins offer more candidates; the bound is documented."""
    assert isinstance(MAX_PROBES, int) and 1 <= MAX_PROBES <= 16
    doc = importlib.import_module("torchlens.ladder.infer").__doc__
    assert f"at most ``MAX_PROBES`` ({MAX_PROBES}) probes" in doc

    class Many:
        @tl.hookimpl
        def torchlens_shape_candidates(self, model):
            return [(1, 3, s) for s in range(4, 30)] if isinstance(model, NeverFits) else None

    register_plugin(Many())
    model = NeverFits()
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model)
    assert err.value.code == "input_inference_failed"
    assert calls.n == calls.fake == MAX_PROBES  # each failed on fake tensors: none ran for real
    assert [r["outcome"] for r in err.value.diary] == ["failed"] * MAX_PROBES


def test_one_diary_row_per_probe():
    """Spec: "... disclosed in a probe diary" -- one row per probe: candidate, outcome, error
    code and message, time."""
    trace = tl.trace(Fits8(), save=None)
    diary = trace.provenance["probe_diary"]
    assert [r["outcome"] for r in diary] == ["failed", "verified"]
    assert [r["candidate"] for r in diary] == [[1, 3, 16], [1, 3, 8]]
    assert [r["probe"] for r in diary] == [1, 2]
    failed, verified = diary
    assert failed["error_code"] == "RuntimeError" and "[16, 3]" in failed["error"]
    assert failed["precheck"]["outcome"] == "failed"  # caught on fake tensors, never run for real
    assert verified["error_code"] is None and verified["error"] is None
    assert verified["precheck"]["outcome"] == "fits" and verified["precheck"]["peak_bytes"] > 0
    assert all(isinstance(r["time_ms"], float) and r["time_ms"] >= 0 for r in diary)


# ---- pinned probes ------------------------------------------------------------------------------


@pytest.mark.parametrize("fits", [True, False])
def test_probes_are_pinned_and_restore_everything(fits, rng_snapshot):
    """Probes run pinned (eval, no-grad, RNG forked, state restored): a train-mode model with
    BatchNorm and Dropout comes back in train mode with bit-identical buffers and RNG -- also
    when probes fail and inference refuses."""
    model = (Fits8() if fits else NeverFits()).train()
    before = state(model)
    same_rng = rng_snapshot()
    if fits:
        tl.trace(model)
    else:
        with pytest.raises(TorchLensError):
            tl.trace(model)
    assert same_rng()
    assert same_state(model, before)
    assert all(m.training for m in model.modules())
    assert torch.is_grad_enabled()


# ---- N probes + 1 verified capture --------------------------------------------------------------


def test_save_none_costs_failed_probes_plus_one(count_forwards):
    """Spec: "the surface consumes the exact verified capture -- the cost is "N probes + 1
    verified capture", never a second capture after verification" (save=None)."""
    model = Fits8()
    calls = count_forwards(model)
    trace = tl.trace(model, save=None)
    failed = sum(r["outcome"] == "failed" for r in trace.provenance["probe_diary"])
    assert failed == 1 and calls.fake == failed + 1 and calls.real == 1
    assert trace.provenance["recapture"] is None
    assert trace.receipt is not None and trace.receipt.verified


def test_default_save_all_recaptures_exactly_once_and_discloses_it(count_forwards):
    """Issue 3: capture options the verified probe did not satisfy (save="all") cause ONE
    recapture from the inferred input with the caller's options, disclosed in the provenance."""
    model = Fits8()
    calls = count_forwards(model)
    trace = tl.trace(model)
    failed = sum(r["outcome"] == "failed" for r in trace.provenance["probe_diary"])
    assert calls.fake == failed + 1 and calls.real == 1 + 1
    recapture = trace.provenance["recapture"]
    assert "save='all'" in recapture["reason"] and "eval" in recapture["policy"]
    assert trace.inputs[0].shape == [1, 3, 8] and trace[-1].saved


def test_zero_argument_trace_is_the_eval_mode_trace_inference_verified():
    """Spec: "The zero-argument trace is necessarily the eval-mode trace that inference
    verified" -- even for a train-mode model, with either save option."""
    model = Fits8().train()
    for save in (None, "all"):
        trace = tl.trace(model, save=save)
        assert trace.meta["training"] is False and trace.meta["grad_enabled"] is False
        assert model.training


@pytest.mark.filterwarnings("ignore:batchnorm_train_stats_mutated")
def test_caller_modes_are_kept_on_the_gold_rung_for_contrast():
    model = Fits8().train()
    trace = tl.trace(model, torch.rand(2, 3, 8))
    assert trace.meta["training"] is True


# ---- refusals -----------------------------------------------------------------------------------


def test_refusal_teaches_the_next_commands_in_order():
    """Spec: "the refusal teaches the exact next command, in order: pass the real call; pass
    input_shape= (including the mapping form); call torchlens.debug.guess_input_shape directly
    with hints." The mapping is spelled with the forward's own parameter names."""
    with pytest.raises(TorchLensError) as err:
        tl.trace(ImageAndTokens())
    teach = err.value.teach
    assert err.value.code == "input_inference_failed" and len(teach) == 3
    assert "tl.trace(model, x)" in teach[0] and "real call" in teach[0]
    assert 'input_shape={"image": (...), "tokens": (...)}' in teach[1]
    assert "torchlens.debug.guess_input_shape(model, hints=" in teach[2]


def test_plugin_teach_comes_first(register_plugin):
    """Spec: "For Hugging Face models the refusal says the better answer first: a real prompt
    string." -- a plugin's torchlens_refusal_teach lines lead the teach."""

    class Better:
        @tl.hookimpl
        def torchlens_refusal_teach(self, model):
            if isinstance(model, ImageAndTokens):
                return ['tl.trace(model, "The quick brown fox")  # a real prompt string']
            return None

    register_plugin(Better())
    with pytest.raises(TorchLensError) as err:
        tl.trace(ImageAndTokens())
    assert err.value.teach[0].startswith('tl.trace(model, "The quick brown fox")')
    assert "real call" in err.value.teach[1]
    assert "guess_input_shape" in err.value.teach[-1]


def test_plugin_shape_candidates_are_probed_first(register_plugin):
    class Hint:
        @tl.hookimpl
        def torchlens_shape_candidates(self, model):
            return [(2, 3, 8)] if isinstance(model, Fits8) else None

    register_plugin(Hint())
    trace = tl.trace(Fits8(), save=None)
    assert [r["outcome"] for r in trace.provenance["probe_diary"]] == ["verified"]
    assert trace.inputs[0].shape == [2, 3, 8]


def test_lazy_module_refuses_before_probing(count_forwards):
    """Spec (lazy modules): "The zero-argument rung refuses BEFORE probing" -- no forward runs
    and the lazy parameters stay un-materialized."""
    model = nn.Sequential(nn.LazyLinear(4))
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model)
    assert err.value.code == "lazy_uninitialized" and calls.n == 0
    with pytest.raises(TorchLensError) as err:
        tl.debug.guess_input_shape(model)
    assert err.value.code == "lazy_uninitialized" and calls.n == 0
    assert isinstance(model[0].weight, nn.parameter.UninitializedParameter)


# ---- torchlens.debug.guess_input_shape ----------------------------------------------------------


def test_guess_input_shape_returns_candidate_and_diary_without_capturing(count_forwards,
                                                                        rng_snapshot):
    """Issue 3: "torchlens.debug.guess_input_shape(model, hints=...) runs the same inference and
    returns the candidate and the diary without capturing." Probes are plain pinned forwards."""
    model = Fits8().train()
    calls = count_forwards(model)
    before, same_rng = state(model), rng_snapshot()
    guess = tl.debug.guess_input_shape(model)
    assert guess.input_shape == (1, 3, 8)
    assert [r["outcome"] for r in guess.diary] == ["failed", "verified"]
    assert calls.fake == len(guess.diary) and calls.real == 1
    assert not getattr(model, "captured", False)
    assert guess.recipes == [{"slot": "0", "keyword": False, "shape": [1, 3, 8],
                              "dtype": "float32", "recipe": "uniform_0_1", "low": 0.0,
                              "high": 1.0, "source": guess.recipes[0]["source"]}]
    assert model.training and same_rng() and same_state(model, before)
    trace = tl.trace(model.eval(), input_shape=guess.input_shape)
    assert trace.provenance["origin"] == "declared"
    assert trace.inputs[0].shape == [1, 3, 8]


def test_guess_input_shape_hints():
    """hints= steer the candidates: a shape hint is probed first; batch and image_size shape
    the core candidates."""
    guess = tl.debug.guess_input_shape(Fits8(), hints={"shape": (4, 3, 8)})
    assert guess.input_shape == (4, 3, 8) and len(guess.diary) == 1
    guess = tl.debug.guess_input_shape(Fits8(), hints={"batch": 2, "seq_len": 8})
    assert guess.input_shape == (2, 3, 8) and len(guess.diary) == 1


@pytest.mark.parametrize("hints", [{"shape": (1, 0)}, {"size": 3}, {"batch": 0},
                                   {"batch": True}, [("shape", (1, 3))]])
def test_bad_hints_refuse_before_any_probe(hints, count_forwards):
    model = Fits8()
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.debug.guess_input_shape(model, hints=hints)
    assert err.value.code == "input_shape_invalid" and calls.n == 0


def test_guess_input_shape_refusal_carries_the_diary():
    with pytest.raises(TorchLensError) as err:
        tl.debug.guess_input_shape(NeverFits())
    assert err.value.code == "input_inference_failed"
    assert err.value.diary and all(r["outcome"] == "failed" for r in err.value.diary)
    assert "guess_input_shape" in err.value.teach[-1]


def test_infer_is_the_shared_engine():
    """``ladder.infer.infer`` takes any probe callable: the same engine serves tl.trace and
    guess_input_shape. It is called only for the candidate that passed the fake-tensor check."""
    seen = []
    found = infer(Fits8(), lambda a, k: seen.append(a[0].shape) or "ok")
    assert found.result == "ok" and seen == [torch.Size([1, 3, 8])]


def test_the_same_candidate_is_never_probed_twice(register_plugin, count_forwards):
    """A plugin's [1, 3, 16] and the core's (1, 3, 16) are one candidate: one probe, not two."""

    class Dup:
        @tl.hookimpl
        def torchlens_shape_candidates(self, model):
            return [[1, 3, 16], [1, 3, 16]] if isinstance(model, NeverFits) else None

    register_plugin(Dup())
    model = NeverFits()
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model)
    candidates = [tuple(r["candidate"]) for r in err.value.diary]
    assert len(candidates) == len(set(candidates)) == calls.n


def test_debug_and_types_are_lazy_submodules():
    """``torchlens.debug`` / ``torchlens.types`` load on first attribute access, not at import."""
    code = ("import sys, torchlens as tl; assert 'torchlens.debug' not in sys.modules; "
            "assert callable(tl.debug.guess_input_shape) and callable(tl.debug.explain); "
            "from torchlens.types import InputSpec; assert tl.types.InputSpec is InputSpec")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
