"""compile=: tl.record and tl.trace through torch.compile, the sites and edits inside the
compiled graph (issue 59). Each case compiles a small model for real (inductor, seconds)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

import torchlens as tl
from tests.core.test_recording_store import token_inputs, token_model
from tests.models.zoo import seeded
from torchlens.capture.policy import state_hash
from torchlens.compiling import run as compiling_run


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) * 2)


class Noisy(nn.Module):
    """Draws random numbers in eval mode: compiled kernels draw other ones."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x) + torch.randn_like(x)


def net() -> Net:
    with seeded(1):
        return Net().eval()


def batches(*sizes: int) -> list[torch.Tensor]:
    with seeded(2):
        return [torch.randn(n, 8) for n in sizes]


def close(a: torch.Tensor | list, b: torch.Tensor | list) -> float:
    if isinstance(a, list):  # a store's ragged rows
        assert len(a) == len(b)
        return max(close(x, y) for x, y in zip(a, b))
    assert a.shape == b.shape
    return (a - b).abs().max().item()


def test_record_store_compiled_equals_eager_with_varied_lengths(tmp_path):
    model, data = token_model(), token_inputs()  # sequence lengths 5, 3, 4 under a mask
    save = ["proj", "embedding_1", "mul_1"]
    eager = tl.record(model, data, save=save, to=tmp_path / "eager")
    compiled = tl.record(model, data, save=save, to=tmp_path / "compiled", compile=True)
    for label in save:
        assert close(eager[label][:], compiled[label][:]) < 1e-5
    manifest = json.loads((tmp_path / "compiled" / "manifest.json").read_text())
    assert manifest["options"]["compile"] == {"backend": "inductor", "mode": None}
    facts = manifest["compiled"]
    assert facts["backend"] == "inductor" and facts["graphs"] >= 1
    assert facts["recompiles"] <= 2  # one length, then a dynamic graph for the rest
    assert facts["first_forward_s"] > 0
    assert set(facts["max_abs_diff"]) == set(save) and max(facts["max_abs_diff"].values()) < 1e-5
    # the same call resumes the compiled store; an eager call refuses to mix into it
    assert len(tl.record(model, data, save=save, to=tmp_path / "compiled", compile=True)["proj"]
               ) == len(compiled["proj"])
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(model, data, save=save, to=tmp_path / "compiled")
    assert err.value.code == "recording_mismatch"


def test_record_compiled_edits_equal_eager_edits():
    model, data = net(), batches(4, 4)
    edits = {"relu_1": tl.edits.zero(index=(slice(None), slice(0, 5))), "b": tl.edits.scale(0.5)}
    plain = tl.record(model, data, save=["mul_1", "b"])
    eager = tl.record(model, data, save=["mul_1", "b"], edits=edits)
    compiled = tl.record(model, data, save=["mul_1", "b"], edits=edits, compile=True)
    assert close(eager["mul_1"], compiled["mul_1"]) < 1e-6
    assert close(eager["b"], compiled["b"]) < 1e-6
    assert (compiled["mul_1"][:, :5] == 0).all() and close(plain["b"], compiled["b"]) > 1e-3
    assert compiled.compiled["graph_breaks"] == 0  # the edits ran inside the graph
    assert compiled.provenance[0]["edits"] == eager.provenance[0]["edits"]


def test_trace_compiled_values_on_the_eager_graph():
    model, (x,) = net(), batches(4)
    edits = {"a": tl.edits.add(torch.ones(16))}
    eager = tl.trace(model, x, save=["relu_1", "b"], edits=edits)
    compiled = tl.trace(model, x, save=["relu_1", "b"], edits=edits, compile=True)
    assert [op.label for op in compiled.ops] == [op.label for op in eager.ops]
    assert close(eager["relu_1"].out, compiled["relu_1"].out) < 1e-6
    assert close(eager["b"].out, compiled["b"].out) < 1e-6
    with pytest.raises(tl.TorchLensError) as err:
        _ = compiled["linear_1"].out  # not a site of save=
    assert err.value.code == "activation_not_saved"
    assert compiled.edits[0]["fired"] and compiled.edits[0]["norm"] == eager.edits[0]["norm"]
    assert compiled.meta["compiled"]["graphs"] >= 1
    assert set(compiled.meta["compiled"]["max_abs_diff"]) == {"relu_1", "b"}


def test_a_compiled_model_records_compiled_and_leaves_nothing_behind(monkeypatch):
    made = []

    class Kept(compiling_run.Compiler):
        def __init__(self, options):
            super().__init__(options)
            made.append(self)

    monkeypatch.setattr(compiling_run, "Compiler", Kept)
    model, data = net(), batches(4, 4)
    model.a.train()  # a mode of its own, kept
    compiled_model = torch.compile(model, backend="eager")
    compiled_model(data[0])
    user_entries = len(_debug_get_cache_entry_list(Net.forward.__code__))
    before = state_hash(model)
    rec = tl.record(compiled_model, data, save=["relu_1", "_orig_mod.b"])  # its addresses
    assert rec.compiled["backend"] == "eager"
    assert close(rec["_orig_mod.b"], model(torch.cat(data))) < 1e-6
    assert close(rec["relu_1"], torch.relu(model.a(torch.cat(data)))) < 1e-6
    assert state_hash(model) == before and model.a.training and not model.b.training
    assert not any(m._forward_hooks for m in model.modules())
    (compiler,) = made
    assert compiler.graphs == 1 and not _debug_get_cache_entry_list(compiler.fn.__code__)
    assert len(_debug_get_cache_entry_list(Net.forward.__code__)) == user_entries
    eager = tl.record(compiled_model, data, save=["relu_1"], compile=False)
    assert eager.compiled is None


def test_compile_refusals_are_typed():
    model = net()
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(tl.TorchLensError) as err:
            tl.record(model, batches(4), save=["relu_1"], compile={"backnd": "inductor"})
        assert err.value.code == "option_invalid" and "compile=" in str(err.value)
        with pytest.raises(tl.TorchLensError) as err:
            tl.trace(model, batches(4)[0], compile=True)  # save="all"
        assert err.value.code == "option_invalid"
        assert "compile=True" in err.value.teach[0]
        assert not calls  # refused before any forward
    finally:
        handle.remove()
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(model, batches(2, 3, 4, 5), save=["relu_1"],
                  compile={"backend": "eager", "dynamic": False, "recompile_limit": 1})
    assert err.value.code == "compile_recompile_limit"
    assert "recompile_limit" in err.value.teach[0]
    with seeded(3):
        noisy = Noisy().eval()
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(noisy, batches(4), save=["add_1"], compile=True)
    assert err.value.code == "site_not_compilable" and "'add_1'" in str(err.value)
    assert err.value.teach[0] == "tl.record(model, inputs, save=[...], compile=False)"
