"""The same string resolves identically on every surface that takes a model input.

Each surface returns the provenance it recorded (or, where it keeps none, the input shapes it
ran on); add surfaces here as they land. The resolver-level test covers every surface name.
"""

from __future__ import annotations

import pytest
import torch

import torchlens as tl

PROMPT = "The quick brown fox"
LAYER = "transformer.h.0.mlp"


SURFACES = {
    "trace": lambda m, tmp: tl.trace(m, PROMPT).provenance,
    "summary": lambda m, tmp: tl.summary(m, PROMPT).provenance,
    "draw": lambda m, tmp: tl.draw(m, PROMPT, path=tmp / "graph", file_format="svg").provenance,
    "trace.run": lambda m, tmp: tl.trace(m, "hello").run(PROMPT).provenance,
    "record": lambda m, tmp: tl.record(m, PROMPT, save=[LAYER], progress=False).provenance[0],
    "debug.resolve_input": lambda m, tmp: tl.debug.resolve_input(m, PROMPT).provenance,
}
SURFACE_NAMES = ["trace", "summary", "draw", "run", "record", "dry_run",
                 "validate_backward_pass", "debug"]


@pytest.mark.parametrize("surface", list(SURFACES))
def test_the_same_string_gives_the_same_resolver_facts(gpt2, surface, tmp_path):
    reference = tl.trace(gpt2.model, PROMPT).provenance
    here = SURFACES[surface](gpt2.model, tmp_path)
    assert here["origin"] == "gold"
    assert here["resolver"] == reference["resolver"]
    assert here["slots"] == reference["slots"]


def test_dry_run_and_backward_validation_take_the_string(gpt2):
    from torchlens.recording import dry_run
    from torchlens.validation import validate_backward_pass

    rows = dry_run(gpt2.model, PROMPT, save=[LAYER])
    n_tokens = len(gpt2.tokenizer(PROMPT)["input_ids"])
    assert rows and all(r["shape"][:2] == [1, n_tokens] for r in rows)
    assert validate_backward_pass(gpt2.model, PROMPT).passed


@pytest.mark.parametrize("surface", SURFACE_NAMES)
def test_the_resolver_is_surface_independent(bert_mlm, surface):
    from torchlens.ladder import resolve

    base = resolve(bert_mlm.model, PROMPT, surface="trace")
    here = resolve(bert_mlm.model, PROMPT, surface=surface)
    assert here.provenance["resolver"] == base.provenance["resolver"]
    assert here.kwargs.keys() == base.kwargs.keys()
    assert all(torch.equal(here.kwargs[k], base.kwargs[k]) for k in base.kwargs)
