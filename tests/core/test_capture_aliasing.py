"""Edges and values under aliasing: writes into disjoint slices, in-place writes to buffers and
parameters, modules built in forward, multi-output module calls, and outputs as copies."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl


class SliceWrites(nn.Module):
    def forward(self, a, b):
        h = torch.zeros(2, 4)
        left, right = h[:, :2], h[:, 2:]
        left.copy_(a)
        right.copy_(b)
        return left * 10 + right + h.sum()


def test_writes_into_disjoint_slices_keep_their_own_edges():
    a, b = torch.randn(2, 2), torch.randn(2, 2)
    trace = tl.trace(SliceWrites(), (a, b))
    assert trace["mul_1"].parents == ["copy__1"]
    assert trace["copy__2"].parents == ["getitem_2", "input_2"]
    assert "copy__2" in trace["add_1"].parents
    assert trace["sum_1"].parents == ["copy__2"]  # the base reads the latest overlapping write
    assert tl.validation.validate_forward_pass(SliceWrites(), (a, b)).passed


class BufferWrite(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.ones(4))

    def forward(self, x):
        self.mask[0] = 0
        return x * self.mask


def test_an_in_place_write_to_a_buffer_is_an_edge():
    trace = tl.trace(BufferWrite(), torch.ones(4))
    assert trace["setitem_1"].children == ["mul_1"]
    assert "setitem_1" in trace["mul_1"].parents and trace["mul_1"].buffers == ["mask"]
    assert tl.validation.validate_forward_pass(BufferWrite(), torch.ones(4)).passed


def test_a_plain_module_built_in_forward_is_disclosed():
    class Builds(nn.Module):
        def forward(self, x):
            if not hasattr(self, "lin"):
                self.lin = nn.Linear(5, 3)
            return self.lin(x)

    trace = tl.trace(Builds(), torch.randn(2, 5))
    assert trace["linear_1"].params == ["lin.weight", "lin.bias"]
    rows = trace.annotations["capture_advisories"]
    assert {r["parameter"] for r in rows} == {"lin.weight", "lin.bias"}


def test_module_out_picks_each_tensor_of_a_multi_output_op():
    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(4, 4)

        def forward(self, x):
            return self.lstm(x)[0]

    model, x = Wrap(), torch.randn(3, 2, 4)
    trace = tl.trace(model, x)
    out, (h, c) = model.lstm(x)
    got = trace["lstm"].out
    assert len(got) == 3 and torch.equal(got[0], out) and torch.equal(got[1], h)
    assert torch.equal(got[2], c)


def test_outputs_are_copies_and_non_tensor_outputs_keep_their_values(tmp_path):
    class Mixed(nn.Module):
        def forward(self, x):
            return x * 2, None, 3, {1: x}

    x = torch.ones(2)
    trace = tl.trace(nn.Identity(), x)
    x.add_(100)
    assert torch.equal(trace.output, torch.ones(2))
    trace = tl.trace(Mixed(), torch.ones(2))
    assert trace.output[1:3] == (None, 3) and list(trace.output[3]) == [1]
    trace.save(tmp_path / "m.tl")
    assert tl.load(tmp_path / "m.tl").output[1:3] == (None, 3)


def test_run_takes_option_overrides_and_typos_in_save_refuse():
    trace = tl.trace(nn.Linear(4, 2), torch.randn(1, 4), save=None)
    again = trace.run(torch.randn(1, 4), save="all")
    assert all(op.saved for op in again)
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(nn.Sequential(nn.Linear(4, 2)), torch.randn(1, 4), save=["linaer_1"])
    assert err.value.code == "save_selection_invalid"
    assert "tl.trace(model, x, save=['linear_1'])" in err.value.teach
    assert not any(op.saved for op in tl.trace(nn.Linear(4, 2), torch.randn(1, 4), save="none")
                   if op.kind == "op")
