"""Reading a trace (issue 18): ``str(trace)`` is an op table, ``_repr_html_`` the same in HTML,
``trace.to_pandas()`` one row per op when pandas is installed and a typed teach when not."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.optable import EDGE, HEADERS


class Loop(nn.Module):
    """Many ops outside any submodule, then a Linear: a long trace."""

    def __init__(self, steps: int = 40) -> None:
        super().__init__()
        self.steps = steps
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        for _ in range(self.steps):
            x = torch.tanh(x) * 0.5
        return self.fc(x)


def small() -> tuple[nn.Module, torch.Tensor]:
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval(), torch.rand(2, 4)


def test_str_is_a_table_of_every_op_of_a_short_trace():
    model, x = small()
    trace = tl.trace(model, x)
    text = str(trace)
    lines = text.splitlines()
    assert lines[0].startswith("Trace of Sequential: 3 ops, 23 params")
    assert all(h in lines[1] for h in HEADERS)
    linear = next(line for line in lines if " linear_1 " in line)
    assert "linear" in linear and " 0 " in linear and "2×3" in linear
    assert "15" in linear and "48" in linear  # 12 + 3 params, 2*2*3*4 FLOPs
    for op in trace:
        assert f" {op.label} " in text
    assert "more ops" not in text and "wall time" in text
    assert repr(trace).startswith("<Trace of Sequential")  # the one-line repr stays


def test_str_of_a_long_trace_shows_head_and_tail_with_a_count():
    trace = tl.trace(Loop().eval(), torch.rand(1, 4), save=None)
    text = str(trace)
    hidden = len(trace) - 2 * EDGE
    assert f"... {hidden} more ops" in text
    assert f" {trace[EDGE - 1].label} " in text and f" {trace[-1].label} " in text
    assert f" {trace[EDGE].label} " not in text
    assert len(text.splitlines()) == 2 * EDGE + 7


def test_repr_html_is_the_same_table_escaped():
    model, x = small()
    trace = tl.trace(model, x)
    page = trace._repr_html_()
    assert page.count("<tr>") == len(trace) + 1 and "<th>Label</th>" in page
    assert "linear_1" in page and "&lt;" not in page.replace("&lt;model&gt;", "")
    long = tl.trace(Loop().eval(), torch.rand(1, 4), save=None)._repr_html_()
    assert "more ops" in long and long.count("<tr>") == 2 * EDGE + 2


def test_to_pandas_gives_one_row_per_op_or_teaches_the_install():
    model, x = small()
    trace = tl.trace(model, x)
    if importlib.util.find_spec("pandas") is None:  # the core-only env
        with pytest.raises(tl.TorchLensError) as err:
            trace.to_pandas()
        assert err.value.code == "dependency_missing" and err.value.teach[0] == "pip install pandas"
        return
    frame = trace.to_pandas()
    assert len(frame) == len(trace)
    assert list(frame["label"]) == [op.label for op in trace]
    assert {"func", "module", "out_shapes", "flops", "time_ns", "num_params"} <= set(frame)
    assert frame.loc[1, "num_params"] == 15 and frame.loc[1, "flops"] == 48


def test_to_pandas_without_pandas_refuses_typed(monkeypatch):
    model, x = small()
    trace = tl.trace(model, x)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas raises ImportError
    with pytest.raises(tl.TorchLensError) as err:
        trace.to_pandas()
    assert err.value.code == "dependency_missing"
    assert err.value.teach == ["pip install pandas", "trace.rows()  # the same rows as plain dicts"]
