"""Synthesized values: a local seed-0 generator, the model's device, and fail-closed recipes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import TorchLensError
from torchlens.ladder import resolve
from torchlens.types import InputSpec

SPEC_NAME = "torchlens.types.InputSpec(shape, dtype=..., low=..., high=...)"


class TokenNet(nn.Module):
    """An embedding entry: the first layer is an Embedding (ids below 50 fit both tables)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(50, 8)
        self.pos = nn.Embedding(64, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.head(self.tok(ids) + self.pos(pos))


class LateEmbedding(nn.Module):
    """An Embedding that is not the first layer: the entry's dtype is not a static fact."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.table = nn.Embedding(10, 4)

    def forward(self, x):
        return self.fc(x) + self.table.weight.sum()


class TwoTokenInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(20, 4)

    def forward(self, ids, other):
        return self.tok(ids) + other


class TokenWithMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(20, 4)

    def forward(self, ids=None, mask=None):
        return self.tok(ids) if ids is not None else mask


def mlp(dtype: torch.dtype = torch.float32) -> nn.Module:
    return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)).to(dtype).eval()


# ---- seed-0 local generator ---------------------------------------------------------------------


@pytest.mark.parametrize("rung", ["declared", "inferred"])
def test_global_rng_is_bit_identical_before_and_after(rung, rng_snapshot):
    """Spec: "Values are synthesized from a local seed-0 generator (your global RNG streams are
    never advanced ...)" -- CPU, and every CUDA device where CUDA is present."""
    model = mlp()
    same = rng_snapshot()
    trace = tl.trace(model, input_shape=(2, 8)) if rung == "declared" else tl.trace(model)
    assert same()
    assert trace.provenance["seed"] == 0 and "Generator" in trace.provenance["generator"]


def test_same_values_on_two_calls_and_they_come_from_seed_0():
    """Seed 0, always: two calls give bit-identical values, equal to a fresh seed-0 draw."""
    model = mlp()
    a = resolve(model, input_shape=(3, 8)).args[0]
    torch.manual_seed(1234)  # the global seed plays no part
    b = resolve(model, input_shape=(3, 8)).args[0]
    assert torch.equal(a, b)
    expected = torch.rand((3, 8), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(a, expected)


def test_tensors_are_made_on_the_models_device():
    """Spec: the synthesized tensors are made on the model's device (here: meta; CUDA too where
    present), and the model is not moved."""
    model = mlp().to("meta")
    res = resolve(model, input_shape={"input": (2, 8)})
    assert res.kwargs["input"].device.type == "meta"
    assert all(p.device.type == "meta" for p in model.parameters())
    if torch.cuda.is_available():
        cuda_model = mlp().cuda()
        trace = tl.trace(cuda_model, input_shape=(2, 8))
        assert trace.inputs[0].device.startswith("cuda")
        assert all(p.is_cuda for p in cuda_model.parameters())


@pytest.mark.parametrize("rung", ["declared", "inferred"])
def test_the_model_is_never_moved(rung):
    """Spec: "... and the model is never moved" -- same parameter objects, devices, dtypes."""
    model = mlp()
    before = [(id(p), p.device, p.dtype) for p in model.parameters()]
    if rung == "declared":
        tl.trace(model, input_shape=(1, 8))
    else:
        tl.trace(model)
    assert [(id(p), p.device, p.dtype) for p in model.parameters()] == before


# ---- recipes ------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:nongold_raw_value_read")
def test_embedding_entry_gives_vocab_bounded_long_ids(count_forwards):
    """Spec: "an unambiguous embedding entry permits vocab-bounded integer ids" -- long ids in
    [0, num_embeddings), bounded by the smallest table of the model."""
    model = TokenNet().eval()
    calls = count_forwards(model)
    trace = tl.trace(model, input_shape=(4, 16))
    ids = trace.inputs[0].out
    assert ids.dtype == torch.long and ids.min() >= 0 and ids.max() < 50
    slot = trace.provenance["slots"][0]
    assert (slot["recipe"], slot["dtype"], slot["low"], slot["high"]) == (
        "vocab_ids", "int64", 0, 50)
    assert "embedding" in slot["source"]
    assert calls.n == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_float_entry_gives_uniform_0_1_in_the_models_float_dtype(dtype):
    """Spec: "an unambiguous float entry permits uniform [0, 1) values" -- in the model's own
    floating dtype (bfloat16 never rounds up to 1.0)."""
    model = mlp(dtype)
    t = resolve(model, input_shape=(64, 8)).args[0]
    assert t.dtype == dtype
    assert t.min() >= 0 and t.max() < 1
    trace = tl.trace(model, input_shape=(64, 8))
    slot = trace.provenance["slots"][0]
    assert slot["recipe"] == "uniform_0_1" and slot["dtype"] == str(dtype).removeprefix("torch.")
    assert trace.inputs[0].dtype == slot["dtype"]


@pytest.mark.parametrize(("model_cls", "shape", "why"), [
    (LateEmbedding, (1, 4), "first layer is not an embedding"),
    (TwoTokenInputs, [(1, 3), (1, 3, 4)], "one of several inputs"),
    (TokenWithMask, {"mask": (1, 4)}, "not the forward's first input"),
])
def test_ambiguity_refuses_naming_the_inputspec_override(model_cls, shape, why, count_forwards):
    """Spec: "ambiguity refuses with a teach naming torchlens.types.InputSpec(shape, dtype=...,
    low=..., high=...) as the override" -- before any forward."""
    model = model_cls()
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model, input_shape=shape)
    assert err.value.code == "input_recipe_ambiguous"
    assert err.value.teach[0].startswith(SPEC_NAME)
    assert why in err.value.message
    assert calls.n == 0


@pytest.mark.filterwarnings("ignore:nongold_raw_value_read")
def test_inputspec_overrides_the_recipe():
    """The InputSpec override wins: dtype and bounds exactly as spelled."""
    spec = {"ids": InputSpec((2, 3), dtype=torch.long, low=5, high=9),
            "other": InputSpec((2, 3, 4), dtype=torch.float64, low=-2.0, high=-1.0)}
    trace = tl.trace(TwoTokenInputs().double(), input_shape=spec)
    ids, other = trace.inputs[0].out, trace.inputs[1].out
    assert ids.dtype == torch.long and ids.min() >= 5 and ids.max() < 9
    assert other.dtype == torch.float64 and other.min() >= -2 and other.max() < -1
    assert [s["recipe"] for s in trace.provenance["slots"]] == ["spec", "spec"]
    assert [(s["low"], s["high"]) for s in trace.provenance["slots"]] == [(5, 9), (-2.0, -1.0)]


def test_inputspec_bounds_without_dtype_keep_the_static_dtype():
    """An InputSpec with only low=/high= keeps the static dtype and uses the caller's bounds."""
    t = resolve(mlp(torch.float64), input_shape=InputSpec((100, 8), low=-3, high=-2)).args[0]
    assert t.dtype == torch.float64 and t.min() >= -3 and t.max() < -2
    ids = resolve(TokenNet(), input_shape=InputSpec((1, 30), high=3)).args[0]
    assert ids.dtype == torch.long and ids.max() < 3
    with pytest.raises(TorchLensError) as err:
        resolve(TokenNet(), input_shape=InputSpec((1, 30), high=2.5))
    assert err.value.code == "input_shape_invalid"


def test_bool_and_narrow_integer_specs():
    mask = resolve(mlp(), input_shape=InputSpec((4, 8), dtype=torch.bool)).args[0]
    assert mask.dtype == torch.bool
    small = resolve(mlp(), input_shape=InputSpec((4, 8), dtype=torch.uint8, low=250,
                                                 high=256)).args[0]
    assert small.dtype == torch.uint8 and small.min() >= 250


def test_dtype_is_never_discovered_by_running_failed_forwards(count_forwards):
    """Spec: "TorchLens never discovers dtypes by running failed forwards." The zero-argument
    rung on an ambiguous model runs NO forward: every candidate is refused statically, and the
    teach spells the InputSpec override in the mapping form."""
    model = LateEmbedding()
    calls = count_forwards(model)
    with pytest.raises(TorchLensError) as err:
        tl.trace(model)
    assert calls.n == 0
    assert err.value.code == "input_inference_failed"
    assert err.value.diary and all(r["outcome"] == "skipped" and
                                   r["error_code"] == "input_recipe_ambiguous"
                                   for r in err.value.diary)
    assert '"x": torchlens.types.InputSpec(' in err.value.teach[1]


@pytest.mark.filterwarnings("ignore:nongold_raw_value_read")
def test_plugin_recipe_facts_come_before_structure(register_plugin):
    """Static facts may come from plugins (hook torchlens_input_recipe)."""

    class Facts:
        @tl.hookimpl
        def torchlens_input_recipe(self, model, slot):
            if isinstance(model, TwoTokenInputs):
                return {"ids": InputSpec((), torch.long, 0, 7),
                        "other": InputSpec((), torch.float32)}.get(slot["name"])
            return None

    register_plugin(Facts())
    trace = tl.trace(TwoTokenInputs(), input_shape={"ids": (2, 3), "other": (2, 3, 4)})
    ids = trace.inputs[0].out
    assert ids.dtype == torch.long and ids.max() < 7
    assert [s["recipe"] for s in trace.provenance["slots"]] == ["vocab_ids", "uniform_0_1"]
    assert all("torchlens_input_recipe" in s["source"] for s in trace.provenance["slots"])


def test_malformed_plugin_recipe_refuses_plugin_invalid(register_plugin):
    class Broken:
        @tl.hookimpl
        def torchlens_input_recipe(self, model, slot):
            return "long" if isinstance(model, TwoTokenInputs) else None

    register_plugin(Broken())
    with pytest.raises(TorchLensError) as err:
        tl.trace(TwoTokenInputs(), input_shape=[(1, 3), (1, 3, 4)])
    assert err.value.code == "plugin_invalid"


def test_plugin_fact_without_a_dtype_fixes_nothing(register_plugin):
    """A recipe fact with no dtype is no fact: the model's structure decides (fail-closed)."""

    class Vague:
        @tl.hookimpl
        def torchlens_input_recipe(self, model, slot):
            return InputSpec(()) if isinstance(model, (TokenNet, LateEmbedding)) else None

    register_plugin(Vague())
    assert resolve(TokenNet(), input_shape=(1, 4)).provenance["slots"][0]["recipe"] == \
        "vocab_ids"
    with pytest.raises(TorchLensError) as err:
        resolve(LateEmbedding(), input_shape=(1, 4))
    assert err.value.code == "input_recipe_ambiguous"
