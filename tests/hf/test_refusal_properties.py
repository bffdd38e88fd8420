"""Issue 61 §1, as a property: whatever a user passes -- sites (op labels, module addresses,
globs, transformer names, garbage), edits of every kind and shape, indices in and out of
range, heads, metrics giving tensors of every shape or no number, at_steps lists -- a public
call either succeeds or refuses with a TorchLensError; no other exception type escapes, and a
refusal leaves the model's parameters, buffers and modes and the global RNG as they were.

Two models: a small pure-torch CNN (convolution, BatchNorm, dropout, two linears) and a
2-layer, 4-head GPT-2 (vocab 100) built from its config.
"""

from __future__ import annotations

import math
import string
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import torchlens as tl

SETTINGS = dict(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(4 * 5 * 5, 12)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(12, 6)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc2(torch.relu(self.drop(self.fc1(h.flatten(1)))))


class Case:
    """One model with its input, a corrupt input, its sites (valid and near-valid) and its
    state as built, to compare with after each refusal."""

    def __init__(self, name: str, model: nn.Module, x: torch.Tensor, corrupt: torch.Tensor,
                 sites: list[str]):
        model.eval()
        self.name, self.model, self.x, self.corrupt, self.sites = name, model, x, corrupt, sites
        self.state = {k: v.clone() for k, v in model.state_dict().items()}
        self.modes = [m.training for m in model.modules()]
        self._ready = None

    def ready(self) -> Any:
        """An intervention-ready trace of the model (for ``trace.push``), made once."""
        if self._ready is None:
            self._ready = tl.trace(self.model, self.x, save="all", intervention_ready=True)
        return self._ready

    def __repr__(self) -> str:
        return f"<{self.name}>"

    def unchanged(self) -> bool:
        now = self.model.state_dict()
        return now.keys() == self.state.keys() and all(
            torch.equal(now[k], v) for k, v in self.state.items()) and \
            [m.training for m in self.model.modules()] == self.modes and \
            all(p.grad is None for p in self.model.parameters())


@pytest.fixture(scope="module")
def models() -> dict[str, Case]:
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng():
        torch.manual_seed(0)
        cnn = Cnn()
        gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=16, n_embd=16,
                                          n_layer=2, n_head=4, bos_token_id=0,
                                          eos_token_id=None, pad_token_id=0))
        x = torch.rand(2, 3, 5, 5)
    gpt2.generation_config.eos_token_id = None
    ids = torch.tensor([[5, 17, 42, 8, 99]])
    return {
        "cnn": Case("cnn", cnn, x, x.flip(0), [
            "conv2d_1", "batch_norm_1", "relu_1", "flatten_1", "linear_1", "linear_2",
            "dropout_1", "linear_1:1", "linear_1:2", "linear_9", "relu_3", "conv", "bn", "fc1",
            "fc2", "fc2:1", "fc2:3", "drop", "fc*", "*", "**", "fc9", "input_1", "output_1",
            "blocks.0.hook_resid_post", "blocks.0.attn.hook_z"]),
        "gpt2": Case("gpt2", gpt2, ids, ids.flip(1), [
            "transformer.h.0", "transformer.h.1.attn", "transformer.h.1.mlp.c_fc",
            "transformer.h.*", "transformer.h.*.mlp", "transformer.h.9", "transformer.wte",
            "lm_head", "scaled_dot_product_attention_1", "scaled_dot_product_attention_2",
            "linear_1", "add_3", "embedding_1", "gelu_1", "blocks.0.hook_resid_pre",
            "blocks.1.hook_resid_post", "blocks.*.hook_resid_post", "blocks.0.attn.hook_z",
            "blocks.1.attn.hook_q", "blocks.0.attn.hook_pattern", "blocks.1.attn.hook_result",
            "blocks.0.mlp.hook_post", "blocks.0.hook_z", "blocks.7.hook_resid_post",
            "resid_pre.1", "blocks.0.ln1.hook_normalized", "embed", "pos_embed", "ln_final",
            "blocks.*.attn.hook_z"]),
    }


def refused_or_done(case: Case, call) -> Any:
    """Run one public call: its result, or None where it refused with a TorchLensError (any
    other exception escapes and fails the property); after a refusal, the model and the RNG
    are as they were."""
    rng = torch.random.get_rng_state()
    try:
        return call()
    except tl.TorchLensError as err:
        assert err.code in tl.errors.CODES, err.code
        assert isinstance(err.teach, list)
        assert case.unchanged(), f"{err.code} left the model changed"
        assert torch.equal(torch.random.get_rng_state(), rng), f"{err.code} moved the RNG"
        return None


# ---- strategies -------------------------------------------------------------------------------
garbage = st.text(alphabet=string.ascii_letters + string.digits + "._:*?[]-/ ", max_size=12)
shapes = st.lists(st.integers(1, 6), max_size=4).map(tuple)
entry = st.one_of(st.integers(-9, 9), st.just(slice(None)),
                  st.builds(slice, st.integers(-6, 6), st.integers(-6, 6)),
                  st.lists(st.integers(-6, 6), min_size=1, max_size=3), st.just(Ellipsis),
                  st.just(None))
def weighted(*choices: tuple[int, Any]) -> Any:
    """One of ``choices`` (weight, strategy), drawn in proportion to the weights."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda k: table[k])


indices = weighted((4, st.none()), (1, st.integers(-9, 9)), (1, st.tuples(entry)),
                   (2, st.lists(entry, min_size=2, max_size=4).map(tuple)),
                   (2, st.lists(st.integers(-3, 9), min_size=1, max_size=3).map(tuple)),
                   (1, st.sampled_from(["all", 1.5, (0, "x"), torch.tensor([0, 7]),
                                        torch.tensor([0.5]), (slice(None, None, -1),)])))
heads = weighted((8, st.none()), (1, st.integers(-5, 8)),
                 (1, st.lists(st.integers(-5, 8), max_size=3)),
                 (1, st.sampled_from(["0", True, 1.0])))
numbers = weighted((4, st.floats(-3, 3, allow_nan=False)), (1, st.integers(-2, 2)),
                   (1, st.sampled_from([float("nan"), True, "2", None])))


@st.composite
def edits(draw, sources: Any = None):
    """One edit of any kind, made through its public constructor (which may refuse)."""
    kind = draw(st.sampled_from(["zero", "zero", "scale", "scale", "add", "replace", "mean",
                                 "skip", "call", "junk"]
                                + (["patch", "mean_of"] if sources else [])))
    index, head = draw(indices), draw(heads)
    shape = draw(shapes)
    dtype = draw(st.sampled_from([torch.float32, torch.int64, torch.complex64, torch.bool]))
    tensor = torch.ones(shape, dtype=dtype)
    if kind == "zero":
        return lambda: tl.edits.zero(index=index, head=head)
    if kind == "scale":
        k = draw(numbers)
        return lambda: tl.edits.scale(k, index=index, head=head)
    if kind == "add":
        alpha = draw(numbers)
        return lambda: tl.edits.add(tensor, alpha, index=index, head=head)
    if kind == "replace":
        return lambda: tl.edits.replace(tensor, index=index, head=head)
    if kind == "mean":
        rows = torch.ones((2, *shape))
        return lambda: tl.edits.mean(rows, index=index, head=head)
    if kind in ("patch", "mean_of"):  # a source trace: this model's, another's, nothing saved
        which = draw(st.sampled_from(sorted(sources)))
        make = tl.edits.patch if kind == "patch" else tl.edits.mean
        return lambda: make(sources[which](), index=index, head=head)
    if kind == "skip":
        return lambda: tl.edits.skip(index=index, head=head)
    if kind == "call":
        gives = draw(st.sampled_from(["same", "half", "half", "shape", "none", "scalar"]))
        made = {"same": lambda v, op: v, "half": lambda v, op: v * 0.5,
                "shape": lambda v, op: torch.ones(shape), "none": lambda v, op: None,
                "scalar": lambda v, op: 2.0}[gives]
        return lambda: made
    junk = draw(st.sampled_from([3, "zero", None, torch.ones(2)]))
    return lambda: junk


@st.composite
def with_item(draw, sources: Any = None):
    """An edit, sometimes choosing the tensor it touches of a tuple output (``item=``)."""
    make = draw(edits(sources))
    item = draw(st.one_of(st.none(), st.none(), st.integers(-2, 3),
                          st.sampled_from(["logits", "past_key_values", "x", 1.5])))
    if item is None:
        return make

    def made():
        edit = make()
        if isinstance(edit, tl.edits.Edit):
            edit.item = item
        return edit
    return made


def sites(case: Case):
    return st.one_of(st.sampled_from(case.sites), st.sampled_from(case.sites),
                     st.sampled_from(case.sites), garbage)


# ---- properties -------------------------------------------------------------------------------
@settings(max_examples=1200, **SETTINGS)
@given(data=st.data())
def test_edits_refuse_typed_and_leave_the_model_as_it_was(models, data):
    case = models[data.draw(st.sampled_from(["cnn", "gpt2"]))]
    n = data.draw(st.sampled_from([1, 1, 1, 2]))
    other = models["gpt2" if case.name == "cnn" else "cnn"]
    sources = {"this": case.ready, "other": other.ready,
               "unsaved": lambda: tl.trace(case.model, case.x, save=None)}
    made = [(data.draw(sites(case)), data.draw(with_item(sources))) for _ in range(n)]
    surface = data.draw(st.sampled_from(["trace", "trace", "trace", "summary", "steps", "push",
                                         "record"] + (["generate"] if case.name == "gpt2"
                                                      else [])))
    allow = data.draw(st.booleans())
    save = data.draw(st.sampled_from([None, "all", [made[0][0]]]))

    def call():
        plan = {site: make() for site, make in made}
        if surface == "summary":
            return tl.summary(case.model, case.x, edits=plan, allow_unfired=allow)
        if surface == "steps":
            with tl.steps(case.model, edits=plan, allow_unfired=allow, save=save) as run:
                case.model(case.x)
                case.model(case.x)
            return run
        if surface == "generate":
            return tl.generate(case.model, case.x, max_new_tokens=2, edits=plan,
                               allow_unfired=allow, save=save)
        if surface == "push":
            return case.ready().push(plan, allow_unfired=allow)
        if surface == "record":
            return tl.record(case.model, [case.x], save=save if isinstance(save, list) else
                             [made[0][0]], edits=plan)
        return tl.trace(case.model, case.x, edits=plan, allow_unfired=allow, save=save)

    refused_or_done(case, call)


def _metric(kind: str, shape: tuple):
    if kind == "tensor":
        return lambda out: _logits(out).flatten()[:max(1, math.prod(shape))].reshape(shape) \
            if math.prod(shape) else _logits(out).flatten()[:0]
    return {"float": lambda out: float(_logits(out).flatten()[0]),
            "int": lambda out: 3, "none": lambda out: None, "str": lambda out: "high",
            "list": lambda out: [1.0], "nan": lambda out: float("nan"),
            "inf": lambda out: _logits(out).flatten()[0] / 0,
            "bool": lambda out: _logits(out).flatten()[0] > 0,
            "raises": lambda out: {}["missing"],
            "logit_diff": lambda out: _logits(out).flatten()[1] - _logits(out).flatten()[0]
            }[kind]


def _logits(out):
    return out.logits if hasattr(out, "logits") else out


@settings(max_examples=300, **SETTINGS)
@given(data=st.data())
def test_sweep_metrics_of_every_shape_refuse_typed(models, data):
    case = models[data.draw(st.sampled_from(["cnn", "gpt2"]))]
    kind = data.draw(st.sampled_from(["tensor", "tensor", "float", "int", "none", "str", "list",
                                      "nan", "inf", "bool", "raises", "logit_diff"]))
    shape = data.draw(st.sampled_from([(), (1,), (3,), (2, 2), (1, 1), (0,)]))
    where = data.draw(st.one_of(st.sampled_from(case.sites), garbage, st.just(["fc1", "conv"]),
                                st.just([]), st.just(5)))
    positions = data.draw(st.one_of(st.none(), st.lists(st.integers(-7, 7), max_size=2),
                                    st.just(3), st.just([True])))
    surface = data.draw(st.sampled_from(["sweep", "sweep", "attribution"]))
    batch = data.draw(st.sampled_from([1, 1, 2, 0]))
    corrupt = data.draw(st.sampled_from([case.corrupt, case.x]))

    def call():
        if surface == "attribution":
            return tl.attribution.patching(case.model, case.x, corrupt, _metric(kind, shape),
                                           sites=where, positions=positions)
        return tl.patching.sweep(case.model, case.x, corrupt, sites=where,
                                 metric=_metric(kind, shape), positions=positions,
                                 batch_size=batch)

    grid = refused_or_done(case, call)
    if grid is not None:
        assert not grid.values.isnan().any()


steps_lists = st.one_of(st.none(), st.integers(-2, 5),
                        st.lists(st.integers(-1, 6), max_size=3),
                        st.sampled_from(["all", [True], slice(-1, 2), slice(0, None, 0),
                                         [1.0], lambda k: k == 1]))


@settings(max_examples=300, **SETTINGS)
@given(data=st.data())
def test_step_runs_refuse_typed_and_teach_their_own_call(models, data):
    case = models[data.draw(st.sampled_from(["cnn", "gpt2"]))]
    at_steps = data.draw(steps_lists)
    save = data.draw(st.one_of(st.none(), st.sampled_from(case.sites).map(lambda s: [s])))
    reads = data.draw(st.lists(st.integers(-4, 6), max_size=2))
    generate = case.name == "gpt2" and data.draw(st.booleans())
    calls = data.draw(st.integers(0, 3))

    def block():
        if generate:
            return tl.generate(case.model, case.x, max_new_tokens=max(calls, 1),
                               at_steps=at_steps, save=save)
        with tl.steps(case.model, at_steps=at_steps, save=save) as run:
            for _ in range(calls):
                case.model(case.x)
        return run

    run = refused_or_done(case, block)
    for i in reads if run is not None else ():
        try:
            run[i]  # noqa: B018
        except tl.TorchLensError as err:
            assert err.code in ("step_not_captured", "steps_not_reached")
            want = "tl.generate(lm, prompt" if generate else ("with tl.steps(model", "run[")
            assert err.teach[0].startswith(want), err.teach


targets = st.one_of(st.none(), st.sampled_from(["sum", "row", "vector", "float", "detached",
                                                "label", "nolabel", "none", "raises"]))


def _target(kind: str | None, case: Case, label: str):
    return {None: None, "sum": lambda out: _logits(out).sum(),
            "row": lambda out: _logits(out)[0].flatten()[1],
            "vector": lambda out: _logits(out)[0], "float": lambda out: 1.0,
            "detached": torch.ones(()), "label": label, "nolabel": "linear_99",
            "none": lambda out: None, "raises": lambda out: {}["missing"]}[kind]


@settings(max_examples=300, **SETTINGS)
@given(data=st.data())
def test_gradient_sites_edits_and_targets_refuse_typed(models, data):
    case = models[data.draw(st.sampled_from(["cnn", "gpt2"]))]
    site = data.draw(sites(case))
    grads = data.draw(st.sampled_from(["all", [site], site, None, 3]))
    grad_edit = data.draw(st.one_of(st.none(), edits()))
    target = data.draw(targets)

    def call():
        trace = tl.trace(case.model, case.x, save_grads=grads,
                         grad_edits={site: grad_edit()} if grad_edit else None)
        return trace.backward(_target(target, case, site))

    refused_or_done(case, call)


@settings(max_examples=50, **SETTINGS)
@given(data=st.data())
def test_a_file_that_is_no_trace_refuses_typed(models, data, tmp_path_factory):
    case = models["cnn"]
    folder = tmp_path_factory.mktemp("files")
    good = folder / "good.tlt"
    tl.trace(case.model, case.x, save=["fc1"]).save(good)
    raw = good.read_bytes()
    how = data.draw(st.sampled_from(["random", "truncated", "flipped", "empty"]))
    if how == "random":
        raw = data.draw(st.binary(max_size=200))
    elif how == "truncated":
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif how == "flipped":
        at = data.draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([raw[at] ^ 0xFF]) + raw[at + 1:]
    else:
        raw = b""
    path = folder / "file.tlt"
    path.write_bytes(raw)
    loaded = refused_or_done(case, lambda: tl.load(path))
    if loaded is not None:
        assert path.read_bytes() == raw  # reading leaves the file as it was
