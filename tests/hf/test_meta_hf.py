"""Transformers models built from configs on the meta device: every metadata surface, the same
rows as the real model, an MoE, accelerate's empty weights, and the command line (issue 15)."""

from __future__ import annotations

import json

import pytest
import torch

import torchlens as tl
from tests.hf.test_cli import run

ROW_KEYS = ("layer", "type", "output_shape", "params", "recursive_params", "flops", "macs")


def llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                       max_position_embeddings=64)


def mixtral_config():
    from transformers import MixtralConfig

    return MixtralConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                         num_local_experts=4, num_experts_per_tok=2,
                         max_position_embeddings=64)


def build(cls_name: str, config, *, meta: bool, dtype=torch.float32):
    import transformers

    cls = getattr(transformers, cls_name)
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            return cls(config).to(dtype).eval()
    return cls(config).to(dtype).eval()


def same_rows(meta_summary, real_summary) -> None:
    assert len(meta_summary.rows) == len(real_summary.rows)
    for m, r in zip(meta_summary.rows, real_summary.rows):
        assert {k: m[k] for k in ROW_KEYS} == {k: r[k] for k in ROW_KEYS}
    for key in ("total_params", "flops", "activation_bytes", "param_bytes"):
        assert meta_summary.totals[key] == real_summary.totals[key], key


@pytest.mark.parametrize("cls_name,config,dtype", [
    ("LlamaForCausalLM", llama_config, torch.float32),
    ("MixtralForCausalLM", mixtral_config, torch.bfloat16),  # the real model's dtype
])
def test_a_meta_model_summarizes_row_by_row_like_the_real_one(cls_name, config, dtype):
    meta = build(cls_name, config(), meta=True, dtype=dtype)
    real = build(cls_name, config(), meta=False, dtype=dtype)
    meta_summary = tl.summary(meta, input_shape=(1, 16))
    same_rows(meta_summary, tl.summary(real, input_shape=(1, 16)))
    assert meta_summary.receipt.verified and meta_summary.receipt.no_values > 0


def test_gpt2_and_bert_from_config_on_meta_through_trace_draw_and_rung_three(tmp_path):
    from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256,
                                          n_positions=64)).eval()
    log = tl.trace(gpt2, input_shape=(2, 8), save=None)
    assert log.meta["values"] == "meta"
    assert tuple([op for op in log if op.func == "linear"][-1].shape) == (2, 8, 256)
    assert tl.draw(gpt2, input_shape=(2, 8), path=tmp_path / "g.svg").receipt.verified
    from accelerate import init_empty_weights

    with init_empty_weights():
        bert = BertModel(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                    intermediate_size=128, vocab_size=256)).eval()
    summary = tl.summary(bert)  # rung 3: inferred from the config, probed on meta
    assert summary.provenance["origin"] == "inferred"
    assert summary.totals["total_params"] == sum(p.numel() for p in bert.parameters())


def test_the_command_line_summarizes_a_config_on_meta(tmp_path):
    config = llama_config()
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(tmp_path)
    out = run("summary", str(tmp_path / "config.json"), "--meta", "--input-shape", "1,16")
    assert out.returncode == 0, out.stderr
    assert "LlamaForCausalLM summary" in out.stdout and "no values to hash" in out.stdout
    real = tl.summary(build("LlamaForCausalLM", llama_config(), meta=False),
                      input_shape=(1, 16))
    assert f"{real.totals['total_params']:,}" in out.stdout
    refused = run("summary", str(tmp_path / "config.json"))
    assert refused.returncode == 4 and "--meta" in refused.stderr
    drawn = run("draw", str(tmp_path), "--meta", "--input-shape", "1,16", "-o",
                str(tmp_path / "g.dot"))  # the folder form; DOT source needs no layout program
    assert drawn.returncode == 0, drawn.stderr
    assert "LlamaDecoderLayer" in (tmp_path / "g.dot").read_text()
    assert json.loads((tmp_path / "config.json").read_text())["architectures"]


def test_a_float32_moe_on_meta_is_taught_the_dtype_its_experts_kernel_takes():
    model = build("MixtralForCausalLM", mixtral_config(), meta=True)
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(model, input_shape={"input_ids": (1, 8)})
    assert err.value.code == "meta_op_unsupported" and "grouped_mm" in str(err.value)
    assert err.value.teach[0].startswith("model.to(torch.bfloat16)")
    model.to(torch.bfloat16)  # the teach's command, as written
    assert tl.summary(model, input_shape={"input_ids": (1, 8)}).receipt.verified
