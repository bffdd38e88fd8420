"""Rung 3 never takes the machine down: every candidate is checked on fake tensors first, and one
whose forward would pass the memory or FLOP budget is skipped without allocating.

The models here grow quadratically with the input (attention over every pixel): the first core
candidate, 1x3x224x224, needs ~10 GB for one attention matrix. Each model also refuses in its own
forward to run for real above 64x64 pixels, so a broken budget fails the test instead of
allocating gigabytes.
"""

from __future__ import annotations

import resource

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import TorchLensError
from torchlens.ladder import budget as budgets

MB = 1 << 20


class PixelAttention(nn.Module):
    """Self-attention over every pixel: memory grows with (H*W)^2. ``data_dependent`` adds a
    branch on a value, which fake tensors cannot follow."""

    def __init__(self, data_dependent: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.out = nn.Conv2d(8, 3, 1)
        self.data_dependent = data_dependent
        self.real_sizes: list[tuple[int, int]] = []

    def forward(self, x):
        from torch._subclasses.fake_tensor import FakeTensor

        f = self.conv(x)
        b, c, h, w = f.shape
        if not isinstance(f, FakeTensor):
            self.real_sizes.append((h, w))
            if h * w > 64 * 64:  # the test's own safety net: never gigabytes for real
                raise AssertionError(f"a {h}x{w} candidate ran for real")
        if self.data_dependent and bool(f.sum() > -1e9):
            f = f * 1.0
        q = f.flatten(2).transpose(1, 2)
        att = torch.softmax(q @ q.transpose(1, 2), dim=-1)  # (H*W) x (H*W)
        return self.out((att @ q).transpose(1, 2).reshape(b, c, h, w))


@pytest.fixture
def small_budget(monkeypatch):
    """40 MB 'available', so the budget is 10 MB: 32x32 (a 4 MB attention matrix) fits, 64x64
    (67 MB) and 224x224 (10 GB) do not."""
    monkeypatch.setattr(budgets, "available_memory", lambda device: (40 * MB, "test: 40 MB"))
    return 10 * MB


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_candidates_over_the_memory_budget_are_skipped_without_allocating(small_budget):
    model = PixelAttention().eval()
    rss = peak_rss_mb()
    trace = tl.trace(model, save=None)
    diary = trace.provenance["probe_diary"]
    big = diary[0]
    assert big["candidate"] == [1, 3, 224, 224]
    assert (big["outcome"], big["error_code"]) == ("skipped", "probe_over_budget")
    assert big["precheck"]["outcome"] == "over_budget"
    assert big["precheck"]["peak_bytes"] > small_budget and "memory budget" in big["error"]
    assert diary[-1]["outcome"] == "verified" and diary[-1]["candidate"] == [1, 3, 32, 32]
    assert diary[-1]["precheck"]["peak_bytes"] <= small_budget
    assert model.real_sizes == [(32, 32)]  # only the candidate that fits ran for real
    assert peak_rss_mb() - rss < 500
    budget = trace.provenance["probe_budget"]
    assert budget["memory_bytes"] == small_budget and budget["memory_fraction"] == 0.25
    assert budget["memory_source"] == "test: 40 MB" and budget["max_flops"] > 0


def test_the_real_budget_is_a_fraction_of_available_memory():
    """Without a patch the budget is MEMORY_FRACTION of what the machine says is available."""
    free, source = budgets.available_memory(torch.device("cpu"))
    assert free and free > 0 and source
    budget = budgets.budget_for(torch.device("cpu"))
    assert budget["memory_bytes"] == int(budget["memory_available_bytes"] * 0.25)
    model = PixelAttention().eval()
    try:  # 1024x1024 pixels: a 4 TB attention matrix, over a quarter of any machine
        diary = tl.debug.guess_input_shape(model, hints={"image_size": 1024}).diary
    except TorchLensError as err:  # other candidates (plugins') may or may not fit this machine
        diary = err.diary
    assert diary[0]["candidate"] == [1, 3, 1024, 1024]
    assert diary[0]["error_code"] == "probe_over_budget"
    assert diary[0]["precheck"]["peak_bytes"] > 4e12
    assert (1024, 1024) not in model.real_sizes


def test_candidates_over_the_flop_budget_are_skipped(monkeypatch):
    """The time bound: a forward estimated above ``MAX_FLOPS`` never runs."""
    monkeypatch.setitem(budgets.MAX_FLOPS, "cpu", 1e6)
    model = PixelAttention().eval()
    with pytest.raises(TorchLensError) as err:
        tl.trace(model, save=None)
    assert err.value.code == "input_inference_failed"
    rows = err.value.diary
    assert rows and all(r["error_code"] == "probe_over_budget" for r in rows)
    assert all("flops budget" in r["error"] for r in rows)
    assert model.real_sizes == []


def test_a_forward_fake_tensors_cannot_follow_runs_guarded(small_budget):
    """A data-dependent forward is 'inconclusive' on fake tensors; it runs for real under a
    guard that sizes each op on meta first and stops before an over-budget allocation."""
    model = PixelAttention(data_dependent=True).eval()
    guess = tl.debug.guess_input_shape(model, hints={"shape": (1, 3, 64, 64)})
    first = guess.diary[0]
    assert first["candidate"] == [1, 3, 64, 64]
    assert first["precheck"]["outcome"] == "inconclusive" and "guarded" in first
    assert (first["outcome"], first["error_code"]) == ("skipped", "probe_over_budget")
    assert guess.input_shape == [1, 3, 32, 32] or tuple(guess.input_shape) == (1, 3, 32, 32)
    assert (64, 64) in model.real_sizes  # it started, and was stopped before the attention


def test_the_budget_survives_save_and_load(small_budget, tmp_path):
    trace = tl.trace(PixelAttention().eval(), save=None)
    trace.save(tmp_path / "t.tl")
    assert tl.load(tmp_path / "t.tl").provenance == trace.provenance


def test_the_fake_check_never_writes_the_models_tensors_or_modes():
    """The check runs over fake copies of the parameters and buffers: an in-place buffer update
    and a train-mode BatchNorm leave the real model exactly as it was."""

    class Counts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(3)
            self.register_buffer("seen", torch.zeros(()))

        def forward(self, x):
            self.seen.add_(1)
            return self.bn(x)

    model = Counts().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    check = budgets.precheck(model, [(torch.Size([4, 3]), torch.float32)], 1, [],
                             budgets.budget_for(torch.device("cpu")))
    assert check.outcome == "fits" and check.peak_bytes > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.training and model.bn.training


def test_explain_states_the_budget(small_budget):
    text = tl.debug.explain(tl.trace(PixelAttention().eval(), save=None))
    assert "each checked on fake tensors" in text
    assert "budget: 0.01 GB of memory (25% of test: 40 MB)" in text
    assert "probe_over_budget" in text


def test_no_probe_starts_once_inference_spent_its_time(monkeypatch):
    """The time bound: after ``MAX_SECONDS`` of inference no new probe starts (here: none)."""
    monkeypatch.setattr(budgets, "MAX_SECONDS", -1.0)
    model = PixelAttention().eval()
    with pytest.raises(TorchLensError) as err:
        tl.trace(model, save=None)
    assert [r["error_code"] for r in err.value.diary] == ["probe_over_budget"]
    assert "-1 s budget" in err.value.diary[0]["error"] and model.real_sizes == []


class Deep(nn.Module):
    """Twenty 64-channel convs: a small peak (each output is freed by the next) but a large sum,
    which is what save="all" keeps."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, padding=1)
        self.body = nn.Sequential(*[nn.Conv2d(64, 64, 3, padding=1) for _ in range(20)])

    def forward(self, x):
        return self.body(self.stem(x))


def test_rung_3_save_all_over_the_budget_refuses_before_recapturing(monkeypatch, count_forwards):
    """tl.trace(model) recaptures the verified input with save="all": when keeping every
    activation would pass the budget, it refuses typed instead (the probe itself fit)."""
    monkeypatch.setattr(budgets, "available_memory", lambda device: (8 * MB, "test: 8 MB"))
    model = Deep().eval()
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model)
    assert err.value.code == "save_over_budget" and "save=None" in err.value.teach[0]
    assert calls.real == 1  # the verified probe, no recapture
    trace = tl.trace(model, save=None)  # the same inference, metadata only
    verified = trace.provenance["probe_diary"][-1]
    assert verified["candidate"] == [1, 3, 32, 32]
    budget = trace.provenance["probe_budget"]["memory_bytes"]  # a quarter of 8 MB
    assert verified["precheck"]["peak_bytes"] <= budget < verified["precheck"]["total_bytes"]
