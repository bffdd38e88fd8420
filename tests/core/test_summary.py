"""tl.summary: the same ladder, one pinned metadata-only capture, a readable table and totals."""

from __future__ import annotations

import torch
from torch import nn

import torchlens as tl
from tests.models.zoo import PURE_CASES
from torchlens.capture.engine import capturing


class Counting(nn.Module):
    """Counts its captured forwards and its plain (uncaptured) ones; rung 3's allocation-free
    checks on fake tensors are neither."""

    def __init__(self):
        super().__init__()
        self.captures = self.plain = 0
        self.body = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        from torch._subclasses.fake_tensor import FakeTensor

        if not isinstance(x, FakeTensor):
            if capturing():  # a recorder is on (the warm-up's write guard records nothing)
                self.captures += 1
            else:
                self.plain += 1
        return self.body(x)


def test_three_rungs_one_capture_each():
    """ONE metadata-only capture per summary, after one uncaptured warm-up forward the first time
    the model runs on inputs of that shape."""
    model = Counting()
    gold = tl.summary(model, torch.rand(1, 6))
    assert (model.captures, model.plain) == (1, 1) and gold.provenance["origin"] == "gold"
    declared = tl.summary(model, input_shape=(2, 6))
    assert (model.captures, model.plain) == (2, 2)
    assert declared.provenance["origin"] == "declared"
    inferred = tl.summary(model)
    inferred_shape = inferred.trace.inputs[0].shape
    warmed = 2 if inferred_shape in ([1, 6], [2, 6]) else 3
    assert (model.captures, model.plain) == (3, warmed)
    assert inferred.provenance["origin"] == "inferred"
    assert not any(op.saved for op in gold.trace)  # metadata only


def test_table_columns_depth_and_text():
    model, x = PURE_CASES["residual"].build()
    full = tl.summary(model, x, depth=None)
    shallow = tl.summary(model, x, depth=1)
    assert max(r["depth"] for r in shallow.rows) == 1
    assert max(r["depth"] for r in full.rows) > 1
    text = str(full)
    for header in ("Layer (type)", "Output shape", "Params", "% params", "FLOPs", "MACs",
                   "Time (ms)", "Total params", "Trainable params", "Non-trainable params",
                   "Estimated total size"):
        assert header in text
    assert text.splitlines()[1].startswith("Input: gold")
    assert "restored and verified" in text.splitlines()[-1]
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("Layer (type)"))
    assert all(len(line) == len(header) for line in lines[3:5])
    html = full._repr_html_()
    assert "<table>" in html and "Input: gold" in html


def test_totals():
    model, x = PURE_CASES["cnn_bn"].build()
    model.conv.weight.requires_grad_(False)
    s = tl.summary(model, x)
    t = s.totals
    assert t["total_params"] == sum(p.numel() for p in model.parameters())
    assert t["frozen_params"] == model.conv.weight.numel()
    assert t["trainable_params"] == t["total_params"] - t["frozen_params"]
    assert t["buffers"] == sum(b.numel() for b in model.buffers())
    assert t["param_bytes"] == sum(p.numel() * p.element_size() for p in model.parameters())
    assert t["flops"] == sum(op.flops for op in s.trace if op.flops) and t["macs"] == \
        t["flops"] // 2
    assert t["activation_bytes"] > 0


def test_tied_parameters_counted_once_and_marked():
    model, x = PURE_CASES["tied_params"].build()
    s = tl.summary(model, x)
    assert s.totals["total_params"] == sum(p.numel() for p in model.parameters())
    assert s.totals["shared_params"] == 1
    assert "tied" in str(s)


def test_op_level_detail_on_request():
    model, x = PURE_CASES["recurrent"].build()
    s = tl.summary(model, x, ops=True)
    op_rows = [r for r in s.rows if r.get("op")]
    assert {r["layer"] for r in op_rows} >= {"linear_2", "linear_2:2", "linear_2:3"}
    assert "linear_2:3" in str(s)


def test_repeated_module_rows_per_call():
    model, x = PURE_CASES["recurrent"].build()
    s = tl.summary(model, x)
    layers = [r["layer"] for r in s.rows]
    assert ["cell:1", "cell:2", "cell:3"] == [n for n in layers if n.startswith("cell")]


def test_uncalled_containers_shown():
    class WithList(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3)])

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    s = tl.summary(WithList(), torch.rand(1, 3))
    assert [r["layer"] for r in s.rows] == ["blocks", "blocks.0", "blocks.1"]
