"""Tables that go to pandas (pandas is in the test env, not in the core-only one)."""

from __future__ import annotations

import pandas
import torch

import torchlens as tl


def test_the_top_differences_go_to_pandas_row_for_row():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    x = torch.randn(4, 6)
    cmp = tl.compare(tl.trace(model, x), tl.trace(model, x, edits={"tanh_1": tl.edits.scale(2)}))
    top = cmp.top(3)
    frame = top.to_pandas()
    assert isinstance(frame, pandas.DataFrame) and len(frame) == len(top) > 0
    assert list(frame["b"]) == [r.b for r in top]
    assert list(frame["relative"]) == [r.relative for r in top]
