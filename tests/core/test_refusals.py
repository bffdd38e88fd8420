"""Issue 61 §1-2: every mistake in what a user passes is a TorchLensError with a code and a
teach, and the teach is the user's own call, corrected.

An index out of range, a metric that is not one number, a sweep with nothing between its
baselines each refuse typed (before any cell runs where it can be known then); an edit's
refusal mid-forward says TorchLens refused, not the model, and leaves the model's RNG and
buffers as they were. The teaches of representative refusals on every surface parse as Python
and call the surface the user called; where they can run, they run and fix the call.
"""

from __future__ import annotations

import ast
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlens as tl
from torchlens.catalogue import catalogue


class Heads(nn.Module):
    """A tiny attention block: 4 heads of 8, through scaled_dot_product_attention."""

    def __init__(self, heads: int = 4, width: int = 32):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        z = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(z.transpose(1, 2).reshape(b, n, d)) + x


class Net(nn.Module):
    """Convolution, BatchNorm, dropout and two linears (batch x 5 out)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(4 * 6 * 6, 16)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(16, 5)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc2(torch.relu(self.drop(self.fc1(h.flatten(1)))))


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _same(model, before):
    after = model.state_dict()
    return after.keys() == before.keys() and all(torch.equal(after[k], before[k])
                                                  for k in before)


@pytest.fixture
def heads():
    torch.manual_seed(0)
    return Heads().eval(), torch.randn(1, 6, 32)


@pytest.fixture
def net():
    torch.manual_seed(0)
    return Net().eval(), torch.rand(2, 3, 6, 6)


# ---- §1: the cases --------------------------------------------------------------------
def test_an_edit_index_out_of_range_refuses_typed_with_the_call_in_range(heads):
    model, x = heads
    site = "scaled_dot_product_attention_1"
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={site: tl.edits.zero(index=(slice(None), 7))})
    e = err.value
    assert isinstance(e, tl.errors.EditError) and e.code == "edit_index_out_of_range"
    assert "[:, 7]" in e.message and "1×4×6×8" in e.message and "axis 1 (size 4)" in e.message
    assert e.teach[0] == (f"tl.trace(model, x, edits={{{site!r}: "
                          "tl.edits.zero(index=(slice(None), 3))})")
    # the note says TorchLens refused, not that the model failed; the partial trace rides on it
    assert any("TorchLens refused this forward (edit_index_out_of_range)" in n and
               "not the model" in n for n in e.__notes__)
    assert not any("raised outside a torch call" in n for n in e.__notes__)
    assert len(e.partial_trace) > 0
    fixed = eval(e.teach[0], {"tl": tl, "model": model, "x": x})  # the teach runs and fixes it
    assert fixed.edits[0]["fired"] and fixed.edits[0]["index"] == "[:, 3]"


def test_a_shape_mismatch_says_the_edit_refused_and_teaches_the_shape_it_needs(heads):
    model, x = heads
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, edits={"qkv": tl.edits.replace(torch.zeros(3, 5))})
    e = err.value
    assert e.code == "edit_shape_mismatch"
    assert e.teach[0] == ("tl.trace(model, x, edits={'qkv': tl.edits.replace(tensor)})  "
                          "# tensor: of shape 1×6×96 (or one that broadcasts to it)")
    assert any("TorchLens refused this forward (edit_shape_mismatch)" in n for n in e.__notes__)
    fixed = eval(e.teach[0], {"tl": tl, "model": model, "x": x, "tensor": torch.zeros(96)})
    assert fixed.edits[0]["fired"]


def test_a_head_out_of_range_teaches_the_heads_there_are():
    torch.manual_seed(0)
    model, x = Heads(heads=2, width=8).eval(), torch.randn(1, 3, 8)
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(model, x, edits={"scaled_dot_product_attention_1":
                                    tl.edits.scale(0.5, index=(0, [0, 5]))})
    assert err.value.code == "edit_index_out_of_range"
    assert err.value.teach[0] == ("tl.summary(model, x, edits={'scaled_dot_product_attention_1'"
                                  ": tl.edits.scale(0.5, index=(0, [0, 1]))})")


def test_the_models_own_exception_passes_through_unchanged():
    class Fails(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            self.fc(x)
            raise ValueError("the model's own")

    with pytest.raises(ValueError, match="the model's own") as err:
        tl.trace(Fails(), torch.rand(1, 4), edits={"fc": tl.edits.zero()})
    assert not isinstance(err.value, tl.TorchLensError)
    assert err.value.partial_trace is not None
    assert any("the forward raised outside a torch call" in n for n in err.value.__notes__)


def test_a_refusal_mid_forward_leaves_rng_and_training_buffers_as_they_were(net):
    model, x = net
    model.train()  # dropout draws from the RNG and BatchNorm updates its statistics
    before, rng = _state(model), torch.random.get_rng_state()
    for edits in ({"fc2": tl.edits.zero(index=(slice(None), 9))},  # after bn and dropout ran
                  {"fc2": tl.edits.add(torch.ones(3))},
                  {"linear_9": tl.edits.zero()}):  # never fires: refused after the forward
        with pytest.raises(tl.TorchLensError):
            tl.trace(model, x, edits=edits)
        assert _same(model, before) and torch.equal(torch.random.get_rng_state(), rng)
    # a successful edited trace in train mode updates them as a plain forward does
    tl.trace(model, x, edits={"fc2": tl.edits.zero(index=(slice(None), 2))})
    assert not _same(model, before)


def test_a_metric_that_is_not_one_number_refuses_before_any_cell(net, count_forwards):
    model, x = net
    calls = count_forwards(model)
    with pytest.raises(tl.TorchLensError) as err:
        tl.patching.sweep(model, x, x.flip(0), sites=["fc1"], metric=lambda out: out[0])
    e = err.value
    assert e.code == "metric_invalid" and "shape 5" in e.message and calls.n == 1
    assert e.teach[0] == ("tl.patching.sweep(model, clean, corrupt, sites=['fc1'], "
                          "metric=lambda out: out[0, 4] - out[0, 3])")
    grid = eval(e.teach[0], {"tl": tl, "model": model, "clean": x, "corrupt": x.flip(0)})
    assert grid.values.shape == (1, 16)
    for metric, said in ((lambda out: "high", "gave str"), (lambda out: out.sum() / 0 * 0, "nan"),
                         (lambda out: out[0, 99], "raised on the clean run's output")):
        with pytest.raises(tl.TorchLensError) as err:
            tl.patching.sweep(model, x, x.flip(0), sites=["fc1"], metric=metric)
        assert err.value.code == "metric_invalid" and said in err.value.message
    assert isinstance(err.value.__cause__, IndexError)  # the metric's own error, chained


def test_equal_baselines_refuse_before_the_cells_run(net, count_forwards):
    model, x = net
    calls = count_forwards(model)
    with pytest.raises(tl.TorchLensError) as err:
        tl.patching.sweep(model, x, x, sites=["fc1"], metric=lambda out: out[0, 1])
    e = err.value
    assert e.code == "metric_baselines_equal" and calls.n == 2  # the two baselines, no cell
    assert e.teach[0].startswith("tl.patching.sweep(model, clean, corrupt, sites=['fc1'], "
                                 "metric=metric)")
    with pytest.raises(tl.TorchLensError) as err:
        tl.attribution.patching(model, x, x, lambda out: out[0, 1], sites=["fc1"])
    assert err.value.code == "metric_baselines_equal"
    assert err.value.teach[0].startswith("tl.attribution.patching(model, clean, corrupt, "
                                         "metric, sites=['fc1'])")


def test_sweep_sites_of_different_lengths_refuse_without_positions(net):
    model, x = net
    with pytest.raises(tl.TorchLensError) as err:
        tl.patching.sweep(model, x, x.flip(0), sites=["fc1", "conv"], metric=lambda o: o[0, 1])
    assert err.value.code == "option_invalid" and "fc1: 16, conv: 4" in err.value.message
    assert err.value.teach[0].endswith("positions=range(0, 4))")
    grid = tl.patching.sweep(model, x, x.flip(0), sites=["fc1", "conv"],
                             metric=lambda o: o[0, 1], positions=range(0, 4))
    assert grid.values.shape == (2, 4)


# ---- §2: a teach is the call that fixes this call ---------------------------------------------
def _loop(model, x, n=2):
    for _ in range(n):
        model(x)


def _steps_not_captured(model, x):
    with tl.steps(model, at_steps=[1]) as run:
        _loop(model, x)
    run[0]  # noqa: B018


def _steps_not_reached(model, x):
    with tl.steps(model, save=["fc1"], at_steps=[1, 5]):
        _loop(model, x)


def _backward_target(model, x):
    tl.trace(model, x, save_grads="all").backward(lambda out: out)


def _pushed(model, x):
    trace = tl.trace(model, x, save="all", intervention_ready=True)
    trace.push({"fc2": tl.edits.zero(index=(slice(None), 7))})


# (what the user called, the code, how it is provoked, what teach[0] starts with, runnable);
# tl.draw's case needs a renderer: tests/viz/test_refusals_draw.py
CASES = [
    ("trace", "edit_index_out_of_range",
     lambda m, x: tl.trace(m, x, edits={"fc1": tl.edits.zero(index=(slice(None), 99))}),
     "tl.trace(model, x, edits=", True),
    ("trace", "save_selection_invalid", lambda m, x: tl.trace(m, x, save=["fc9"]),
     "tl.trace(model, x, save=", True),
    ("trace", "edit_site_not_fired",
     lambda m, x: tl.trace(m, x, edits={"linear_3": tl.edits.zero()}),
     "tl.trace(model, x, edits={'linear_", True),
    ("summary", "edit_index_out_of_range",
     lambda m, x: tl.summary(m, x, edits={"fc2": tl.edits.scale(2.0, index=(slice(None), 5))}),
     "tl.summary(model, x, edits=", True),
    ("summary", "option_invalid", lambda m, x: tl.summary(m, x, grads="yes"),
     "tl.summary(model, x, grads=", True),
    ("record", "save_selection_invalid", lambda m, x: tl.record(m, [x], save=["fc9"]),
     "tl.record(model, inputs, save=", True),
    ("record", "edit_index_out_of_range",
     lambda m, x: tl.record(m, [x], save=["fc1"],
                            edits={"fc1": tl.edits.zero(index=(slice(None), 16))}),
     "tl.record(model, inputs, save=[...], edits=", False),
    ("steps", "step_not_captured", _steps_not_captured,
     "with tl.steps(model, at_steps=[0, 1]) as run:", True),
    ("steps", "steps_not_reached", _steps_not_reached,
     "with tl.steps(model, save=['fc1'], at_steps=[1]) as run:", True),
    ("steps", "option_invalid",
     lambda m, x: tl.steps(m, at_steps="all").__enter__(),
     "with tl.steps(model, at_steps=[0, 1, 2]) as run:", False),
    ("patching.sweep", "metric_invalid",
     lambda m, x: tl.patching.sweep(m, x, x.flip(0), sites="fc1", metric=lambda o: o),
     "tl.patching.sweep(model, clean, corrupt, sites='fc1', metric=lambda out:", True),
    ("patching.sweep", "edit_site_unknown",
     lambda m, x: tl.patching.sweep(m, x, x.flip(0), sites=["fc9"], metric=lambda o: o[0, 1]),
     "tl.patching.sweep(model, clean, corrupt, sites=['fc", True),
    ("patching.sweep", "option_invalid",
     lambda m, x: tl.patching.sweep(m, x, x.flip(0), sites=["fc1"], metric=lambda o: o[0, 1],
                                    positions=[40]),
     "tl.patching.sweep(model, clean, corrupt, sites=['fc1'], metric=metric, positions=", True),
    ("edits", "edit_invalid", lambda m, x: tl.edits.zero(index="all"), "tl.edits.zero(", True),
    ("edits", "edit_invalid", lambda m, x: tl.edits.scale(torch.ones(2)), "tl.edits.scale(",
     True),
    ("push", "edit_index_out_of_range", _pushed, "trace.push({'fc2': tl.edits.zero(", False),
    ("grads", "save_selection_invalid", lambda m, x: tl.trace(m, x, save_grads=["fc9"]),
     "tl.trace(model, x, save_grads=", True),
    ("grads", "grads_target_invalid", _backward_target, "trace.backward(", False),
]


@pytest.mark.parametrize("surface,code,provoke,starts,runnable", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_each_surfaces_teach_is_its_own_call_corrected(net, surface, code, provoke, starts,
                                                       runnable):
    model, x = net
    with pytest.raises(tl.TorchLensError) as err:
        provoke(model, x)
    assert err.value.code == code
    teach = err.value.teach[0]
    ast.parse(teach)  # Python as written
    assert teach.startswith(starts), teach
    if runnable:
        space = {"tl": tl, "torch": torch, "model": model, "x": x, "inputs": [x], "clean": x,
                 "corrupt": x.flip(0), "metric": lambda o: o[0, 1]}
        if teach.startswith("with tl.steps("):  # the user's loop in the block
            teach = teach.split(": ...")[0] + ":\n    model(x); model(x)\n"
        exec(compile(teach, "<teach>", "exec"), space)  # the corrected call runs
        if "run" in space and code == "step_not_captured":
            assert space["run"][0] is not None  # and reads the step that was refused


def test_every_teach_of_the_catalogue_written_as_code_parses():
    """The error page's teaches (``…`` a value known at raise time): each one written as a
    call or a statement is Python; the others are instructions in words (pip install ...)."""
    code = re.compile(r"(with )?[\w.]+(\(|\[| = )")
    checked = 0
    for row in catalogue():
        for teach in row["teach"]:
            if code.match(teach):
                ast.parse(teach.replace("…", "_"))
                checked += 1
    assert checked > 100
