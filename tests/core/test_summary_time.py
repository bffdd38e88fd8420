"""tl.summary's Time column (issue 18): say what the figure is, and keep one-time setup out of a
layer's cost -- one uncaptured warm-up forward runs first under the same pinning, disclosed."""

from __future__ import annotations

import time

import torch
from torch import nn

import torchlens as tl
from torchlens.capture.policy import state_hash


class SetupOnce(nn.Module):
    """Pays 0.3 s of one-time setup on its first call, like a first-call kernel selection."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = False

    def forward(self, x):
        if not self.ready:
            time.sleep(0.3)
            self.ready = True
        return x * 2


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.setup = SetupOnce()
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.setup(self.fc(x)))


def test_one_time_setup_does_not_pass_for_a_layers_cost():
    s = tl.summary(Net(), torch.rand(2, 4))
    row = next(r for r in s.rows if r["layer"] == "setup")
    assert row["time_ms"] < 150  # the 300 ms of first-call setup went to the warm-up
    timing = s.trace.meta["timing"]
    assert timing["warmup_forwards"] == 1 and timing["warmup_ms"] >= 300


def test_the_time_column_says_what_it_is():
    s = tl.summary(Net(), torch.rand(2, 4))
    line = next(line for line in str(s).splitlines() if line.startswith("Time (ms):"))
    assert "one captured forward" in line and "warm-up" in line and "excluded" in line
    assert "warm-up" in s._repr_html_()


def test_the_warm_up_keeps_the_receipt_and_the_callers_state():
    model = Net().train()
    torch.manual_seed(3)
    x = torch.rand(2, 4)
    rng, h0 = torch.get_rng_state(), state_hash(model)
    s = tl.summary(model, x)
    assert s.receipt.verified and s.receipt.hash_before == s.receipt.hash_after
    assert model.training and torch.equal(rng, torch.get_rng_state())
    assert state_hash(model) == h0  # the bytes too


def test_no_warm_up_while_lazy_parameters_are_pending_and_it_says_so():
    model = nn.Sequential(nn.LazyLinear(3), nn.ReLU())
    s = tl.summary(model, input_shape=(2, 5))
    assert s.trace.meta["timing"]["warmup_forwards"] == 0
    assert s.receipt.materialized  # they materialized in the one captured forward
    assert "no warm-up: lazy parameters" in str(s)


def test_the_warm_up_runs_once_per_model_and_input_shape():
    model = Net()
    forwards = []
    model.fc.register_forward_hook(lambda *_: forwards.append(1))
    first = tl.summary(model, torch.rand(2, 4))
    assert first.trace.meta["timing"]["warmup_forwards"] == 1 and len(forwards) == 2
    again = tl.summary(model, torch.rand(2, 4))
    assert again.trace.meta["timing"] == {
        "warmup_forwards": 0, "warm": True, "note": again.trace.meta["timing"]["note"]}
    assert len(forwards) == 3  # the captured forward alone: one-time setup was already paid
    assert "earlier warm-up of this model" in str(again)
    row = next(r for r in again.rows if r["layer"] == "setup")
    assert row["time_ms"] < 150
    tl.summary(model, torch.rand(5, 4))  # another input shape: its own warm-up
    assert len(forwards) == 5
