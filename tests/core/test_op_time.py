"""What an op's time_ns measures is said, and a capture never synchronizes a device per op."""

from __future__ import annotations

import torch
from torch import nn

import torchlens as tl
from torchlens.capture.engine import time_kind


def test_time_kind_says_cuda_times_are_launch_times():
    assert "launch time, not kernel time" in time_kind({torch.device("cuda", 0)})
    assert "launch time" in time_kind({torch.device("cpu"), torch.device("cuda", 1)})
    cpu = time_kind({torch.device("cpu")})
    assert "on CPU" in cpu and "launch" not in cpu


def test_the_trace_and_the_summary_disclose_the_time_kind():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    trace = tl.trace(model, torch.rand(2, 4), save=None)
    assert trace.meta["op_time"] == time_kind({torch.device("cpu")})
    summary = tl.summary(model, torch.rand(2, 4))
    assert "launch time" not in summary._time_line()
    summary.trace.meta["op_time"] = time_kind({torch.device("cuda", 0)})
    assert "(on CUDA: host launch time, not kernel time)" in summary._time_line()


def test_a_capture_never_synchronizes_or_creates_events(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: calls.append("event"))
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(5)])
    tl.trace(model, torch.rand(1, 8))
    tl.trace(model, torch.rand(1, 8), save=None)
    tl.summary(model, torch.rand(1, 8))
    assert calls == []
