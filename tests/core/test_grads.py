"""Gradients of any site (issue 46): save_grads= and trace.backward, equal to
torch.autograd.grad on the same tensors; gradient edits against hand-written hooks; refusals
before any forward; the model's .grad and hooks left as they were."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl


class Net(nn.Module):
    """An in-place ReLU on a Linear's output, and a Linear used twice (two passes)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.shared = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = torch.relu_(self.inp(x))
        a = self.shared(h)
        b = self.shared(torch.tanh(a))
        return self.head(a + b)


def _net():
    torch.manual_seed(0)
    return Net()


X = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))


def _reference(model, x, target_fn=lambda y, kept: (y ** 2).sum()):
    """The same gradients by hand: the forward written out, autograd.grad on its tensors."""
    kept = {}
    xr = x.clone().requires_grad_(True)
    lin = model.inp(xr)
    kept["linear_1"] = lin
    h = torch.relu(lin)
    kept["relu__1"] = h
    a = model.shared(h)
    kept["linear_2"] = a
    t = torch.tanh(a)
    kept["tanh_1"] = t
    b = model.shared(t)
    kept["linear_2:2"] = b
    s = a + b
    kept["add_1"] = s
    y = model.head(s)
    kept["input_1"] = xr
    names = list(kept)
    grads = torch.autograd.grad(target_fn(y, kept), [kept[n] for n in names],
                                allow_unused=True, materialize_grads=True)
    return dict(zip(names, grads))


def test_every_site_kind_equals_autograd_grad_on_the_same_tensors():
    model = _net()
    want = _reference(model, X)
    trace = tl.trace(model, X, save_grads=["linear_1", "relu__1", "shared", "add_1", "input_1",
                                           "head"])
    table = trace.backward(lambda y: (y ** 2).sum())
    for label in ("linear_1", "relu__1", "add_1", "input_1"):  # op sites, in-place included
        assert torch.allclose(trace[label].grad, want[label], atol=1e-6), label
    # a module called twice: each call's output gradient; the bare address needs a call
    assert torch.allclose(trace["shared:1"].grad, want["linear_2"], atol=1e-6)
    assert torch.allclose(trace["shared:2"].grad, want["linear_2:2"], atol=1e-6)
    with pytest.raises(tl.TorchLensError) as err:
        trace["shared"].grad  # noqa: B018
    assert err.value.code == "key_not_found" and "trace['shared:1'].grad" in err.value.teach
    assert trace["head"].grad.shape == (5, 3)
    assert {row["label"] for row in table} >= {"linear_1", "relu__1", "add_1", "input_1"}
    row = next(r for r in table if r["label"] == "add_1")
    assert row["norm"] == pytest.approx(float(want["add_1"].norm()), rel=1e-5)
    assert row["max_abs"] == pytest.approx(float(want["add_1"].abs().max()), rel=1e-5)


def test_all_pass_qualified_and_globs_select_as_save_does():
    model = _net()
    want = _reference(model, X)
    every = tl.trace(model, X, save_grads="all")
    every.backward(lambda y: (y ** 2).sum())
    assert torch.allclose(every["linear_2"].grad, want["linear_2"], atol=1e-6)
    assert torch.allclose(every["linear_2:2"].grad, want["linear_2:2"], atol=1e-6)
    assert torch.allclose(every["tanh_1"].grad, want["tanh_1"], atol=1e-6)
    one = tl.trace(model, X, save_grads=["linear_2:2"])
    one.backward(lambda y: (y ** 2).sum())
    assert torch.allclose(one["linear_2:2"].grad, want["linear_2:2"], atol=1e-6)
    with pytest.raises(tl.TorchLensError) as err:
        one["linear_2"].grad  # noqa: B018  (pass 1 was not asked for)
    assert err.value.code == "grads_unavailable"
    glob = tl.trace(model, X, save_grads=["s*"])
    glob.backward(lambda y: (y ** 2).sum())
    assert torch.allclose(glob["shared:2"].grad, want["linear_2:2"], atol=1e-6)


def test_targets_a_tensor_a_callable_or_an_op_label():
    model = _net()
    trace = tl.trace(model, X, save_grads=["linear_1", "add_1"])
    trace.backward(trace.output[0, 1], retain_graph=True)
    first = trace["linear_1"].grad.clone()
    want = _reference(model, X, lambda y, kept: y[0, 1])["linear_1"]
    assert torch.allclose(first, want, atol=1e-6)
    trace.backward("add_1")  # an op label: its value summed
    want = _reference(model, X, lambda y, kept: kept["add_1"].sum())
    assert torch.allclose(trace["add_1"].grad, torch.ones(5, 6))
    assert torch.allclose(trace["linear_1"].grad, want["linear_1"], atol=1e-6)
    other = tl.trace(model, X, save_grads=["add_1"])
    for bad, code in ((trace.output.detach().sum(), "grads_target_invalid"),
                      (lambda y: y, "grads_target_invalid"),
                      ("tanh_1", "grads_target_invalid")):
        with pytest.raises(tl.TorchLensError) as err:
            other.backward(bad)
        assert err.value.code == code


def test_a_second_backward_needs_retain_graph():
    model = _net()
    trace = tl.trace(model, X, save_grads="all")
    trace.backward(lambda y: y.sum())
    with pytest.raises(tl.TorchLensError) as err:
        trace.backward(lambda y: y.sum())
    assert err.value.code == "grads_graph_freed"
    assert "retain_graph=True" in err.value.teach[0]
    kept = tl.trace(model, X, save_grads="all")
    kept.backward(lambda y: y.sum(), retain_graph=True)
    first = kept["add_1"].grad.clone()
    kept.backward(lambda y: y.sum())
    assert torch.equal(first, kept["add_1"].grad)


class Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def test_refusals_come_before_any_forward():
    model = Counting()
    x = torch.randn(2, 3)
    cases = []
    with torch.no_grad():
        cases.append(lambda: tl.trace(model, x, save_grads="all"))
    cases.append(lambda: tl.trace(model, x, save_grads=["nope.layer"]))
    cases.append(lambda: tl.trace(model, x, save_grads=3))
    cases.append(lambda: tl.trace(model, x, save_grads="all",
                                  grad_edits={"lin": tl.edits.skip()}))
    codes = []
    for case in cases[1:]:
        with pytest.raises(tl.TorchLensError) as err:
            case()
        codes.append(err.value.code)
    with torch.no_grad(), pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, save_grads="all")
    assert err.value.code == "grads_unavailable" and "torch.enable_grad()" in err.value.teach[0]
    with torch.inference_mode(), pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x, save_grads="all")
    assert err.value.code == "grads_unavailable"
    meta = Counting().to("meta")
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(meta, torch.randn(2, 3, device="meta"), save_grads="all")
    assert err.value.code == "grads_unavailable" and "meta" in err.value.message
    assert codes == ["save_selection_invalid", "save_selection_invalid", "edit_invalid"]
    assert model.calls == 0 and meta.calls == 0


def test_reading_a_gradient_too_early_or_from_a_file_refuses(tmp_path):
    model = _net()
    trace = tl.trace(model, X, save_grads=["add_1"])
    with pytest.raises(tl.TorchLensError) as err:
        trace["add_1"].grad  # noqa: B018
    assert err.value.code == "grads_unavailable" and "trace.backward(target)" in err.value.teach
    plain = tl.trace(model, X)
    with pytest.raises(tl.TorchLensError) as err:
        plain.backward(lambda y: y.sum())
    assert err.value.code == "grads_unavailable"
    assert 'save_grads="all"' in err.value.teach[0]
    trace.save(tmp_path / "t.tlt")
    with pytest.raises(tl.TorchLensError) as err:
        tl.load(tmp_path / "t.tlt").backward(lambda y: y.sum())
    assert err.value.code == "grads_unavailable"


def test_model_grads_untouched_unless_asked_and_nothing_stays_hooked():
    model = _net()
    before = {n: p.grad for n, p in model.named_parameters()}
    trace = tl.trace(model, X, save_grads="all", grad_edits={"tanh_1": tl.edits.scale(0.5)})
    trace.backward(lambda y: y.sum())
    assert all(p.grad is None for p in model.parameters()) and all(v is None for v in
                                                                   before.values())
    for m in model.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
    assert "forward" not in model.__dict__
    asked = tl.trace(model, X, save_grads=["add_1"])
    asked.backward(lambda y: y.sum(), param_grads=True)
    xr = X.clone()
    ref = [p.clone() for p in torch.autograd.grad(model(xr).sum(), list(model.parameters()))]
    assert all(torch.allclose(p.grad, r, atol=1e-6) for p, r in zip(model.parameters(), ref))
    again = tl.trace(model, X, save_grads=["add_1"])
    again.backward(lambda y: y.sum(), param_grads=True)  # accumulates, as backward() does
    assert all(torch.allclose(p.grad, 2 * r, atol=1e-6) for p, r in zip(model.parameters(), ref))


def test_gradient_edits_equal_hand_written_register_hook_code():
    model = _net()
    trace = tl.trace(model, X, save_grads=["input_1", "linear_1"],
                     grad_edits={"tanh_1": tl.edits.scale(0.25),
                                 "add_1": tl.edits.zero(index=(slice(None), 2))})
    trace.backward(lambda y: (y ** 2).sum())
    xr = X.clone().requires_grad_(True)
    lin = model.inp(xr)
    h = torch.relu(lin)
    a = model.shared(h)
    t = torch.tanh(a)
    t.register_hook(lambda g: g * 0.25)
    s = a + model.shared(t)

    def zero_col(g):
        g = g.clone()
        g[:, 2] = 0
        return g

    s.register_hook(zero_col)
    gx, glin = torch.autograd.grad((model.head(s) ** 2).sum(), [xr, lin])
    assert torch.allclose(trace["input_1"].grad, gx, atol=1e-6)
    assert torch.allclose(trace["linear_1"].grad, glin, atol=1e-6)
    rows = {row["site"]: row for row in trace.edits}
    assert rows["tanh_1"]["kind"] == "scale (grad)" and rows["tanh_1"]["norm"] > 0
    assert rows["add_1"]["index"] == "[:, 2]" and rows["add_1"]["backward"]
    assert not trace.edited  # the forward's values are the model's own
    assert "scale (grad)" in str(trace.edits)


def test_a_gradient_edit_no_gradient_reaches_is_an_error():
    model = _net()
    trace = tl.trace(model, X, save_grads=["linear_1", "linear_2"],
                     grad_edits={"head": tl.edits.zero()})
    with pytest.raises(tl.TorchLensError) as err:
        trace.backward("linear_2")  # the head is downstream of the target
    assert err.value.code == "edit_site_not_fired" and "head" in err.value.message


def test_an_integer_op_needs_no_gradient():
    class Ids(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)

        def forward(self, ids):
            return self.emb(ids + 1)

    model = Ids()
    trace = tl.trace(model, torch.tensor([[1, 2, 3]]), save_grads="all")
    table = trace.backward(lambda y: y.sum())
    assert next(r for r in table if r["label"] == "add_1")["note"] == "needs no gradient"
    with pytest.raises(tl.TorchLensError) as err:
        trace["add_1"].grad  # noqa: B018
    assert err.value.code == "grads_unavailable" and "int64" in err.value.message
    assert trace["embedding_1"].grad.shape == (1, 3, 4)
