"""Issue 61 §1-2 on a 2-layer, 4-head GPT-2 (vocab 100): the issue's own calls refuse typed,
and tl.generate's refusals teach tl.generate (not tl.steps), corrected; each teach runs."""

from __future__ import annotations

import ast

import pytest
import torch

import torchlens as tl


@pytest.fixture(scope="module")
def lm():
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32,
                                           n_layer=2, n_head=4, bos_token_id=0,
                                           eos_token_id=None, pad_token_id=0)).eval()
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture
def ids():
    return torch.tensor([[5, 17, 42, 8, 99, 23]])


def _space(lm, ids, **more):
    return {"tl": tl, "torch": torch, "lm": lm, "model": lm, "x": ids, "prompt": ids,
            "clean": ids, "corrupt": ids.flip(1), **more}


def test_the_issues_index_out_of_range_on_a_4_head_model(lm, ids):
    site = "scaled_dot_product_attention_1"
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(lm, ids, edits={site: tl.edits.zero(index=(slice(None), 7))})
    e = err.value
    assert e.code == "edit_index_out_of_range" and "1×4×6×8" in e.message
    assert e.teach[0] == (f"tl.trace(model, x, edits={{{site!r}: "
                          "tl.edits.zero(index=(slice(None), 3))})")
    assert any("TorchLens refused this forward" in n for n in e.__notes__)
    assert eval(e.teach[0], _space(lm, ids)).edits[0]["fired"]


def test_a_head_past_the_last_of_a_transformer_name_teaches_the_last_head(lm, ids):
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(lm, ids, edits={"blocks.1.attn.hook_z": tl.edits.zero(head=[1, 9])})
    e = err.value
    assert e.code == "edit_index_out_of_range" and "head= takes heads 0 to 3" in e.message
    assert e.teach[0] == ("tl.trace(model, x, edits={'blocks.1.attn.hook_z': "
                          "tl.edits.zero(head=[1, 3])})")
    assert eval(e.teach[0], _space(lm, ids)).edits[0]["fired"]


def test_the_issues_vector_metric_refuses_before_the_sweep_runs(lm, ids, count_forwards):
    calls = count_forwards(lm)
    with pytest.raises(tl.TorchLensError) as err:
        tl.patching.sweep(lm, ids, ids.flip(1), sites=["transformer.h.*"],
                          metric=lambda o: o.logits[0, -1])
    e = err.value
    assert e.code == "metric_invalid" and "shape 100" in e.message and calls.n == 1
    assert e.teach[0] == ("tl.patching.sweep(model, clean, corrupt, sites=['transformer.h.*'], "
                          "metric=lambda out: out.logits[0, -1, 42] - out.logits[0, -1, 7])")
    grid = eval(e.teach[0], _space(lm, ids))
    assert grid.values.shape == (2, 6) and not grid.values.isnan().any()


def test_equal_metrics_refuse_instead_of_a_nan_grid(lm, ids, count_forwards):
    calls = count_forwards(lm)
    with pytest.raises(tl.TorchLensError) as err:
        tl.patching.sweep(lm, ids, ids, sites=["transformer.h.*"],
                          metric=lambda o: o.logits[0, -1, 3])
    assert err.value.code == "metric_baselines_equal" and calls.n == 2
    grid = eval(err.value.teach[0].partition("  #")[0],
                _space(lm, ids, metric=lambda o: o.logits[0, -1, 3]))
    assert not grid.values.isnan().any()


def test_generate_teaches_generate(lm, ids, count_forwards):
    run = tl.generate(lm, ids, max_new_tokens=4, at_steps=[1, 2])
    with pytest.raises(tl.TorchLensError) as err:
        run[0]  # noqa: B018
    e = err.value
    assert e.code == "step_not_captured"
    assert e.teach == ["tl.generate(lm, prompt, max_new_tokens=4, at_steps=[0, 1, 2])"]
    space = _space(lm, ids)
    exec(f"run = {e.teach[0]}", space)
    assert space["run"].captured == [0, 1, 2]
    with pytest.raises(tl.TorchLensError) as err:
        run[9]  # noqa: B018
    assert err.value.code == "steps_not_reached"
    assert err.value.teach[0] == "tl.generate(lm, prompt, max_new_tokens=10, at_steps=[1, 2, 9])"
    # at_steps past max_new_tokens is known before any forward
    calls = count_forwards(lm)
    with pytest.raises(tl.TorchLensError) as err:
        tl.generate(lm, ids, max_new_tokens=3, at_steps=[1, 5])
    assert err.value.code == "steps_not_reached" and calls.n == 0
    assert err.value.teach == ["tl.generate(lm, prompt, max_new_tokens=6, at_steps=[1, 5])",
                               "tl.generate(lm, prompt, max_new_tokens=3, at_steps=[1])"]
    for options, code, starts in (
            (dict(at_steps="last"), "option_invalid",
             "tl.generate(lm, prompt, max_new_tokens=2, at_steps=[0, 1, 2])"),
            (dict(edits={"transformer.h.0": tl.edits.add(torch.ones(5))}),
             "edit_shape_mismatch", "tl.generate(lm, prompt, edits={'transformer.h.0': "
                                    "tl.edits.add(vector)})"),
            (dict(edits={"transformer.h.9": tl.edits.zero()}), "edit_site_unknown",
             "tl.generate(lm, prompt, edits={'transformer.h.")):
        with pytest.raises(tl.TorchLensError) as err:
            tl.generate(lm, ids, max_new_tokens=2, **options)
        assert err.value.code == code and err.value.teach[0].startswith(starts)
        ast.parse(err.value.teach[0])


def test_a_generation_that_ends_early_teaches_generating_every_step(lm, ids):
    first = tl.generate(lm, ids, max_new_tokens=1).tokens[0]
    with pytest.raises(tl.TorchLensError) as err:  # the end-of-text token stops it at step 0
        tl.generate(lm, ids, max_new_tokens=4, at_steps=[3], eos_token_id=first)
    e = err.value
    assert e.code == "steps_not_reached" and "generation made 1 call(s)" in e.message
    assert e.teach[0] == (f"tl.generate(lm, prompt, max_new_tokens=4, at_steps=[3], "
                          f"eos_token_id={first}, min_new_tokens=4)")
    assert eval(e.teach[0], _space(lm, ids)).captured == [3]
