"""Backward validation of a model that runs in bfloat16: autograd and the op-by-op replay add
the same gradients in different orders, each sum rounded to bfloat16, so gradients are compared
by norm at the dtype's tolerance; a broken graph still fails."""

from __future__ import annotations

import torch

from tests.graph_breakage import forget_producers
from torchlens import validation


def t5(dtype):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(d_model=32, d_ff=48, num_layers=2, num_heads=4, d_kv=8, vocab_size=99,
                      decoder_start_token_id=0, dropout_rate=0.0)
    model = T5ForConditionalGeneration(config).to(dtype).train()
    return model, {"input_ids": torch.randint(3, 90, (2, 8)),
                   "decoder_input_ids": torch.randint(3, 90, (2, 4))}


def test_a_bfloat16_model_validates_backward_by_norm(monkeypatch):
    model, inputs = t5(torch.bfloat16)
    report = validation.validate_backward_pass(model, inputs)
    assert report.passed, report.failed[:3]
    assert report.tolerance["measure"] == "norm" and report.tolerance["rtol"] == 5e-2
    assert "bfloat16" in report.tolerance["why"]
    # a tolerance the caller passes is used as given (still by norm)
    assert validation.validate_backward_pass(model, inputs, rtol=1e-4).tolerance["rtol"] == 1e-4
    forget_producers(monkeypatch)
    assert not validation.validate_backward_pass(model, inputs).passed


def test_a_float32_model_still_validates_backward_element_by_element():
    model, inputs = t5(torch.float32)
    report = validation.validate_backward_pass(model, inputs)
    assert report.passed
    assert report.tolerance == {"measure": "elementwise", "rtol": 1e-4, "atol": 1e-6}
