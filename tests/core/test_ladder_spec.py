"""Spec sentences of the quickstart's ladder sections that have no other home, each named in its
test's docstring (the others live in test_ladder_rungs / _input_shape / _recipes / _inference /
_provenance / _guardrails)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import TorchLensError
from torchlens.types import InputSpec, ResolvedInput
from torchlens.viz import Renderer

PROMPT = "The quick brown fox"


def resnet_stand_in() -> nn.Module:
    """A tiny stand-in for resnet18: any 224x224 RGB batch works."""
    return nn.Sequential(nn.Conv2d(3, 4, 7, stride=8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(4, 10)).eval()


class ToyTokenizer:
    name_or_path = "toy/tokenizer"
    vocab_size = 32

    def __call__(self, text: str) -> torch.Tensor:
        return torch.tensor([[sum(map(ord, w)) % self.vocab_size for w in text.split()]])


class ToyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 8)
        self.lm_head = nn.Linear(8, 32)
        self.tokenizer = ToyTokenizer()

    def forward(self, input_ids):
        return self.lm_head(self.embed(input_ids))


class ToyClip(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(32, 8)
        self.patch = nn.Conv2d(3, 8, 16, stride=16)

    def forward(self, input_ids, pixel_values, attention_mask):
        text = (self.tok(input_ids) * attention_mask[..., None]).mean(1)
        image = self.patch(pixel_values).flatten(2).mean(-1)
        return text @ image.T


class ToyHF:
    """What an HF-like plugin does for the toy models: resolve a prompt with the model's own
    tokenizer, give static recipes, and teach a real prompt first."""

    @tl.hookimpl
    def torchlens_resolve_input(self, model, value):
        if not (isinstance(model, ToyLM) and isinstance(value, str)):
            return None
        tok = model.tokenizer
        return ResolvedInput(kwargs={"input_ids": tok(value)}, objects={"tokenizer": tok},
                             facts={"tokenizer_class": type(tok).__name__,
                                    "name_or_path": tok.name_or_path,
                                    "vocab_size": tok.vocab_size, "text": value})

    @tl.hookimpl
    def torchlens_input_recipe(self, model, slot):
        if not isinstance(model, ToyClip):
            return None
        return {"input_ids": InputSpec((), torch.long, 0, 32),
                "attention_mask": InputSpec((), torch.long, 1, 2),
                "pixel_values": InputSpec((), torch.float32)}.get(slot["name"])


# ---- the three rungs ----------------------------------------------------------------------------


def test_quickstart_three_rungs_block():
    """Spec code block "The three rungs": rung 1 your real input (best), rung 2 your shape with
    random values (disclosed), rung 3 inferred shape + random values (disclosed)."""
    model = resnet_stand_in()
    x = torch.rand(1, 3, 224, 224)
    logs = [tl.trace(model, x), tl.trace(model, input_shape=(1, 3, 224, 224)), tl.trace(model)]
    assert [log.provenance["origin"] for log in logs] == ["gold", "declared", "inferred"]
    assert all(log.inputs[0].shape == [1, 3, 224, 224] for log in logs)
    assert len({tuple(op.func for op in log) for log in logs}) == 1  # one graph, three inputs
    assert [log.provenance["seed"] for log in logs] == [None, 0, 0]


class NodeList(Renderer):
    """A minimal renderer, so tl.draw runs with torchlens-core alone."""

    name = "ladder-node-list"
    source_format = "txt"

    def build_source(self, view) -> str:
        return "\n".join(node.id for node in view.nodes)


class NodeListPlugin:
    @tl.hookimpl
    def torchlens_renderers(self):
        return {NodeList.name: NodeList}


def test_every_entry_verb_accepts_the_same_three_ways(tmp_path, register_plugin):
    """Spec: "Every TorchLens entry verb -- tl.trace, tl.summary, and the one-call render facade
    -- accepts its input the same three ways. Learn one call shape and you own every surface."
    (tl.debug's resolver too), rung conflicts included."""
    register_plugin(NodeListPlugin())
    model = resnet_stand_in()
    x = torch.rand(1, 3, 224, 224)

    def draw(*args, **kwargs):
        return tl.draw(*args, path=tmp_path / f"g{len(list(tmp_path.iterdir()))}.txt",
                       renderer=NodeList.name, file_format="txt", **kwargs)

    for verb in (tl.trace, tl.summary, draw):
        got = [verb(model, x), verb(model, input_shape=(1, 3, 224, 224)), verb(model)]
        assert [g.provenance["origin"] for g in got] == ["gold", "declared", "inferred"]
        with pytest.raises(TorchLensError) as err:
            verb(model, x, input_shape=(1, 3, 224, 224))
        assert err.value.code == "input_rung_conflict"
    res = tl.debug.resolve_input(model, input_shape=(1, 3, 224, 224))
    assert res.provenance["origin"] == "declared" and res.args[0].shape == (1, 3, 224, 224)


# ---- rung 1: strings are real inputs ------------------------------------------------------------


def test_hf_prompt_string_is_a_gold_input_with_tokenizer_provenance(register_plugin):
    """Spec: "For Hugging Face models, a prompt string is a gold input: it is tokenized with the
    model's own tokenizer, and the tokenizer provenance is recorded on the trace." (core side:
    the resolve hook; tl.trace(lm, "The quick brown fox"))."""
    register_plugin(ToyHF())
    lm = ToyLM().eval()
    log = tl.trace(lm, PROMPT)
    prov = log.provenance
    assert prov["origin"] == "gold"
    assert prov["resolver"] == {"tokenizer_class": "ToyTokenizer", "name_or_path":
                                "toy/tokenizer", "vocab_size": 32, "text": PROMPT}
    assert torch.equal(log.inputs[0].out, lm.tokenizer(PROMPT))
    assert prov["slots"] == [{"slot": "input_ids", "keyword": True, "kind": "tensor",
                              "shape": [1, 4], "dtype": "int64", "device": "cpu",
                              "recipe": "caller"}]


def test_debug_helpers_resolve_a_string_exactly_as_trace_does(register_plugin):
    """Spec: "The same string ... is a real input wherever a model input is taken: ... the
    tl.debug helpers resolve it exactly as tl.trace does." (trace.run, tl.record,
    tl.recording.dry_run and tl.validation are not part of torchlens-core yet.)"""
    register_plugin(ToyHF())
    lm = ToyLM().eval()
    res = tl.debug.resolve_input(lm, PROMPT)
    log = tl.trace(lm, PROMPT)
    assert res.args == () and torch.equal(res.kwargs["input_ids"], log.inputs[0].out)
    assert res.provenance == log.provenance


def test_a_string_with_no_resolving_plugin_refuses_with_a_teach():
    """Without a plugin that resolves it, a string is refused typed (input_unresolved), never
    guessed at; the teach names torchlens-hf first."""
    with pytest.raises(TorchLensError) as err:
        tl.trace(resnet_stand_in(), PROMPT)
    assert err.value.code == "input_unresolved"
    assert "torchlens-hf" in err.value.teach[0]


# ---- rung 2: the multi-input mapping ------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:nongold_raw_value_read")
def test_clip_mapping_example_reaches_a_multi_input_model(register_plugin):
    """Spec: "A mapping binds forward keyword names to shapes -- this is how multi-input models
    are reachable: tl.trace(clip, input_shape={"input_ids": (1, 16), "pixel_values":
    (1, 3, 224, 224), "attention_mask": (1, 16)})" -- with recipes from plugin facts."""
    register_plugin(ToyHF())
    log = tl.trace(ToyClip().eval(), input_shape={
        "input_ids": (1, 16),
        "pixel_values": (1, 3, 224, 224),
        "attention_mask": (1, 16),
    })
    slots = {s["slot"]: s for s in log.provenance["slots"]}
    assert {k: (s["shape"], s["dtype"], s["recipe"]) for k, s in slots.items()} == {
        "input_ids": ([1, 16], "int64", "vocab_ids"),
        "pixel_values": ([1, 3, 224, 224], "float32", "uniform_0_1"),
        "attention_mask": ([1, 16], "int64", "ones"),
    }
    values = {op.slot: op.out for op in log.inputs}
    assert values["input_ids"].max() < 32 and bool((values["attention_mask"] == 1).all())


def test_clip_mapping_without_facts_fails_closed():
    """Spec: "Dtype and value recipes are fail-closed static facts" -- without plugin facts the
    same call refuses (input_recipe_ambiguous) and teaches the InputSpec override."""
    with pytest.raises(TorchLensError) as err:
        tl.trace(ToyClip(), input_shape={"input_ids": (1, 16), "pixel_values": (1, 3, 224, 224),
                                          "attention_mask": (1, 16)})
    assert err.value.code == "input_recipe_ambiguous"
    assert "InputSpec(shape, dtype=..., low=..., high=...)" in err.value.teach[0]


# ---- rung 3 -------------------------------------------------------------------------------------


def test_hf_refusal_says_the_better_answer_first(register_plugin):
    """Spec: "For Hugging Face models the refusal says the better answer first: a real prompt
    string." -- a two-input model with no static facts, with the plugin's teach."""

    class Teach:
        @tl.hookimpl
        def torchlens_refusal_teach(self, model):
            return [f'tl.trace(model, "{PROMPT}")'] if isinstance(model, ToyClip) else None

    register_plugin(Teach())
    with pytest.raises(TorchLensError) as err:
        tl.trace(ToyClip())
    assert err.value.code == "input_inference_failed"
    assert err.value.teach[0] == f'tl.trace(model, "{PROMPT}")'
    assert '"input_ids"' in err.value.teach[2] and '"pixel_values"' in err.value.teach[2]


def test_incompatible_capture_options_recapture_from_the_inferred_input():
    """Spec: "asking for incompatible capture options recaptures from the inferred input with
    your options instead (disclosed in the provenance record)." -- a save= selection."""
    model = resnet_stand_in()
    log = tl.trace(model, save=["4"])
    assert log.provenance["recapture"] is not None
    assert [op.module for op in log if op.saved and op.kind == "op"] == ["4"]
    assert log.inputs[0].shape == log.provenance["slots"][0]["shape"]


# ---- what synthesized inputs mean ---------------------------------------------------------------


def test_successful_inference_proves_the_synthesized_call_ran_and_verified():
    """Spec: "Successful inference proves that this exact synthesized call ran under the stated
    execution policy and its capture verified." -- eval + no-grad, a verified receipt, and the
    verified diary row is exactly the recorded input."""
    model = resnet_stand_in().train()
    log = tl.trace(model, save=None)
    assert log.meta["training"] is False and log.meta["grad_enabled"] is False
    assert log.receipt.verified and log.meta["receipt"]["pinned"]["mode"] == "eval"
    verified = log.provenance["probe_diary"][-1]
    assert verified["outcome"] == "verified"
    assert verified["candidate"] == log.provenance["slots"][0]["shape"] == log.inputs[0].shape


def test_synthesized_values_can_change_the_graph_and_the_record_says_so():
    """Spec: "Synthesized values can change the graph, not just the numbers: same-shaped inputs
    with different values may take different control-flow paths" -- and "It does not prove ...
    a stable graph for other data, or another input's control-flow path."""

    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            y = self.fc(x)
            return y.exp().sum() if x.mean() > 0 else y.relu()

    model = Branchy().eval()
    neg = tl.trace(model, input_shape=InputSpec((1, 4), low=-1.0, high=0.0))
    pos = tl.trace(model, input_shape=InputSpec((1, 4), low=0.0, high=1.0))
    assert [op.func for op in neg] != [op.func for op in pos]
    assert [(s["low"], s["high"]) for s in neg.provenance["slots"]] == [(-1.0, 0.0)]
    assert [(s["low"], s["high"]) for s in pos.provenance["slots"]] == [(0.0, 1.0)]
    assert "another input's control-flow path" in tl.debug.explain(pos)


def test_a_synthesized_trace_cannot_masquerade_after_a_handoff(tmp_path):
    """Spec: "Every synthesized-input trace therefore carries a persistent provenance record --
    origin, shapes, dtypes, recipe, seed, strategy, probe diary -- that survives
    Trace.save/tl.load, so a synthesized trace can never masquerade as a real one after a
    handoff." """
    log = tl.trace(resnet_stand_in())
    log.save(tmp_path / "handoff.tlens")
    got = tl.load(tmp_path / "handoff.tlens")
    prov = got.provenance
    assert prov["origin"] == "inferred" and "input inferred" in repr(got)
    slot = prov["slots"][0]
    assert (slot["shape"], slot["dtype"], slot["recipe"]) == ([1, 3, 224, 224], "float32",
                                                             "uniform_0_1")
    assert prov["seed"] == 0 and prov["strategy"] == "inference" and prov["probe_diary"]
    with pytest.raises(TorchLensError) as err:
        got.decode_output()
    assert err.value.code == "nongold_semantics_unavailable"


def test_raw_values_are_real_measurements_of_a_forward_over_random_data():
    """Spec: "the numbers are real measurements of a forward pass over random data" -- the
    saved output is exactly what the model computes on the recorded synthesized input."""
    model = resnet_stand_in()
    log = tl.trace(model, input_shape=(2, 3, 224, 224))
    with pytest.warns(tl.TorchLensWarning, match="nongold_raw_value_read"):
        x = log.inputs[0].out
    with torch.no_grad():
        assert torch.allclose(log[-1].out, model(x))


def test_a_string_is_a_real_input_wherever_a_model_input_is_taken(register_plugin):
    """Spec: "The same string ... is a real input wherever a model input is taken: trace.run,
    tl.record, tl.recording.dry_run, tl.validation.validate_backward_pass and the tl.debug
    helpers resolve it exactly as tl.trace does." """
    register_plugin(ToyHF())
    lm = ToyLM().eval()
    ids = lm.tokenizer(PROMPT)
    log = tl.trace(lm, PROMPT)
    again = log.run(PROMPT)
    assert torch.equal(again.inputs[0].out, ids) and again.provenance == log.provenance
    recording = tl.record(lm, PROMPT, save=["lm_head"], progress=False)
    assert recording.provenance == [{**log.provenance, "surface": "record"}]
    rows = tl.recording.dry_run(lm, PROMPT, save=["lm_head"])
    assert [r["shape"] for r in rows] == [[1, ids.shape[1], 32]]
    report = tl.validation.validate_backward_pass(lm, PROMPT)
    assert report.rows and all(r["status"] != "failed" for r in report.rows)
    assert torch.equal(tl.debug.resolve_input(lm, PROMPT).kwargs["input_ids"], ids)
