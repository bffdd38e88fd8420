"""Tiny transformers of many architectures, built from configs (no hub, no downloads).

Each ``TransformerCase`` builds a 2-block, 32-wide, 4-head model (d_head 8) under a forked,
seeded RNG, in eval mode, and an input for it: token ids (a sequence longer than the attention
window where the architecture has one), or pixels for the ViT. ``parts`` names, per
architecture, the modules a forward hook can check each transformer name against (written from
the transformers source by hand, so the tests' references never come from TorchLens):

``blocks``: the block list; ``pos``, ``ln_final``: the learned position embedding and the final
norm (the token embedding is ``get_input_embeddings()``). In each block (relative addresses):
``q``/``k``/``v`` the attention's projections, or ``qkv`` a fused one with ``qkv_split`` its
layout (``"cat"``: q | k | v along features; ``"heads"``: per head (q, k, v) of d_head each;
``"mqa"``: q heads, then one k head and one v head; ``"codegen"``: 4 model-parallel pieces,
each q | v | k); ``o`` the output projection; ``act_in`` the
module whose output the activation reads (or ``gate_up`` a fused gate | up projection); ``down``
the MLP's last projection; ``ln1``/``ln2`` the norms TransformerLens names so (a parallel
block with one norm has ln1 alone); ``attn_branch``/``mlp_branch`` the modules whose output
is what the residual adds add; ``post_ln`` where the norms read the adds (BERT); ``parallel``
where attention and MLP read the same stream; ``scale`` the attention's scale when it is not
``d_head ** -0.5``; ``alibi`` where a position bias is added to the scores; ``window`` where a
layer attends within a sliding window (shorter than the input).

Norm weights and biases are drawn away from 1 and 0 (a norm at its init is no check of a
name read before the norm's scale and shift).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["TRANSFORMER_CASES", "TransformerCase", "build"]

VOCAB = 100
SEQ = 10  # tokens per row; the sliding windows below are 4 wide
WINDOW = 4
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
             pad_token_id=0, use_cache=False)


@dataclass(frozen=True)
class TransformerCase:
    """One architecture of the zoo: ``make()`` returns ``(model, inputs)`` (inputs: forward
    kwargs)."""

    name: str
    make: Callable[[], tuple[nn.Module, dict[str, torch.Tensor]]]
    kind: str = "decoder"  # or "encoder"
    parts: dict[str, Any] = field(default_factory=dict)
    note: str = ""  # what the architecture adds to the zoo


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _ids(seed: int, batch: int = 2, seq: int = SEQ) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.randint(3, VOCAB, (batch, seq),
                                       generator=torch.Generator().manual_seed(seed))}


def _causal(model_cls: str, config_cls: str, seed: int, inputs: dict | None = None,
            **config: Any) -> Callable[[], tuple[nn.Module, dict]]:
    def make() -> tuple[nn.Module, dict]:
        import transformers

        options = {**SMALL, **config}
        with _seeded(seed):
            model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**options))
        return model.eval(), inputs if inputs is not None else _ids(seed)
    return make


def build(case: TransformerCase) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The case's model (eval) and input, quietly (transformers' config warnings off)."""
    from transformers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        model, inputs = case.make()
    finally:
        logging.set_verbosity(level)
    with _seeded(1000), torch.no_grad():
        for module in model.modules():
            if "norm" not in type(module).__name__.lower():
                continue
            weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
            if isinstance(weight, torch.Tensor):
                gemma = "gemma" in type(module).__name__.lower()  # scales by 1 + weight
                weight.uniform_(-0.5, 0.5) if gemma else weight.uniform_(0.5, 1.5)
            if isinstance(bias, torch.Tensor):
                bias.uniform_(-0.2, 0.2)
    return model, inputs


def _vit() -> tuple[nn.Module, dict]:
    from transformers import ViTConfig, ViTModel

    with _seeded(21):
        model = ViTModel(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=64, image_size=16, patch_size=4,
                                   num_channels=3), add_pooling_layer=False)
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(21))
    return model.eval(), {"pixel_values": pixels}


def _masked(seed: int) -> dict[str, torch.Tensor]:
    ids = _ids(seed)
    mask = torch.ones_like(ids["input_ids"])
    mask[1, -2:] = 0  # the second row is padded: its last two keys are masked
    return {**ids, "attention_mask": mask}


LLAMA_PARTS = dict(blocks="model.layers", ln_final="model.norm", q="self_attn.q_proj",
                   k="self_attn.k_proj", v="self_attn.v_proj", o="self_attn.o_proj",
                   act_in="mlp.gate_proj", down="mlp.down_proj", ln1="input_layernorm",
                   ln2="post_attention_layernorm", attn_branch="self_attn", mlp_branch="mlp")
SANDWICH = dict(attn_branch="post_attention_layernorm", mlp_branch="post_feedforward_layernorm")
GEMMA2_PARTS = {**LLAMA_PARTS, **SANDWICH, "ln2": "pre_feedforward_layernorm"}
BERT_PARTS = dict(blocks="encoder.layer", pos="embeddings.position_embeddings",
                  q="attention.self.query", k="attention.self.key", v="attention.self.value",
                  o="attention.output.dense", act_in="intermediate.dense", down="output.dense",
                  ln1="attention.output.LayerNorm", ln2="output.LayerNorm",
                  attn_branch="attention.output.dense", mlp_branch="output.dense", post_ln=True)


TRANSFORMER_CASES: list[TransformerCase] = [
    TransformerCase("GPT-2", _causal(
        "GPT2LMHeadModel", "GPT2Config", 1, n_embd=32, n_layer=2, n_head=4, n_positions=64,
        vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, use_cache=False),
        parts=dict(blocks="transformer.h", pos="transformer.wpe", ln_final="transformer.ln_f",
                   qkv="attn.c_attn", qkv_split="cat", o="attn.c_proj", act_in="mlp.c_fc",
                   down="mlp.c_proj", ln1="ln_1", ln2="ln_2", attn_branch="attn",
                   mlp_branch="mlp"),
        note="learned positions, fused qkv (Conv1D), pre-LN"),
    TransformerCase("GPT-Neo", _causal(
        "GPTNeoForCausalLM", "GPTNeoConfig", 2, hidden_size=32, num_layers=2, num_heads=4,
        attention_types=[[["global", "local"], 1]], window_size=WINDOW, intermediate_size=64,
        vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=1, eos_token_id=2,
        use_cache=False),
        parts=dict(blocks="transformer.h", pos="transformer.wpe", ln_final="transformer.ln_f",
                   q="attn.attention.q_proj", k="attn.attention.k_proj",
                   v="attn.attention.v_proj", o="attn.attention.out_proj", act_in="mlp.c_fc",
                   down="mlp.c_proj", ln1="ln_1", ln2="ln_2", attn_branch="attn",
                   mlp_branch="mlp", scale=1.0, window=True),
        note="eager attention, unscaled scores, a local layer (window 4)"),
    TransformerCase("GPT-J", _causal(
        "GPTJForCausalLM", "GPTJConfig", 3, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
        n_positions=64, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, use_cache=False),
        parts=dict(blocks="transformer.h", ln_final="transformer.ln_f", q="attn.q_proj",
                   k="attn.k_proj", v="attn.v_proj", o="attn.out_proj", act_in="mlp.fc_in",
                   down="mlp.fc_out", ln1="ln_1", attn_branch="attn",
                   mlp_branch="mlp", parallel=True),
        note="parallel residual with one norm, partial interleaved rotary"),
    TransformerCase("GPT-NeoX", _causal(
        "GPTNeoXForCausalLM", "GPTNeoXConfig", 4, use_parallel_residual=True,
        rotary_pct=0.5),
        parts=dict(blocks="gpt_neox.layers", ln_final="gpt_neox.final_layer_norm",
                   qkv="attention.query_key_value", qkv_split="heads", o="attention.dense",
                   act_in="mlp.dense_h_to_4h", down="mlp.dense_4h_to_h", ln1="input_layernorm",
                   ln2="post_attention_layernorm", attn_branch="attention", mlp_branch="mlp",
                   parallel=True),
        note="parallel residual with two norms, fused qkv, partial rotary"),
    TransformerCase("Llama", _causal("LlamaForCausalLM", "LlamaConfig", 5,
                                     num_key_value_heads=2),
                    parts=LLAMA_PARTS, note="GQA, rotary, RMSNorm, gated MLP"),
    TransformerCase("Mistral", _causal("MistralForCausalLM", "MistralConfig", 6,
                                       num_key_value_heads=2, sliding_window=WINDOW),
                    parts={**LLAMA_PARTS, "window": True},
                    note="sliding window (4) shorter than the input (10)"),
    TransformerCase("Mixtral", _causal("MixtralForCausalLM", "MixtralConfig", 7,
                                       num_key_value_heads=2, num_local_experts=4,
                                       num_experts_per_tok=2, sliding_window=None),
                    parts={**LLAMA_PARTS, "act_in": None, "down": None},
                    note="sparse mixture of experts (4 experts, top 2)"),
    TransformerCase("Qwen2", _causal("Qwen2ForCausalLM", "Qwen2Config", 8,
                                     num_key_value_heads=2),
                    parts=LLAMA_PARTS, note="GQA, q/k/v biases"),
    TransformerCase("Qwen3", _causal("Qwen3ForCausalLM", "Qwen3Config", 9,
                                     num_key_value_heads=2, head_dim=8),
                    parts=LLAMA_PARTS, note="RMSNorm of each q and k head"),
    TransformerCase("Gemma", _causal("GemmaForCausalLM", "GemmaConfig", 10,
                                     num_key_value_heads=1, head_dim=8),
                    parts=LLAMA_PARTS, note="multi-query, (1 + w) RMSNorm, scaled embedding"),
    TransformerCase("Gemma2", _causal("Gemma2ForCausalLM", "Gemma2Config", 11,
                                      num_key_value_heads=2, head_dim=8, sliding_window=WINDOW,
                                      query_pre_attn_scalar=8),
                    parts={**GEMMA2_PARTS, "window": True},
                    note="eager attention with logit softcapping, sandwich norms, sliding "
                         "window"),
    TransformerCase("Gemma3", _causal("Gemma3ForCausalLM", "Gemma3TextConfig", 12,
                                      num_key_value_heads=2, head_dim=8, sliding_window=WINDOW,
                                      query_pre_attn_scalar=8,
                                      layer_types=["sliding_attention", "full_attention"]),
                    parts={**GEMMA2_PARTS, "window": True},
                    note="q/k norms, sandwich norms, a sliding and a full layer"),
    TransformerCase("Phi", _causal("PhiForCausalLM", "PhiConfig", 13,
                                   partial_rotary_factor=0.5),
                    parts=dict(blocks="model.layers", ln_final="model.final_layernorm",
                               q="self_attn.q_proj", k="self_attn.k_proj", v="self_attn.v_proj",
                               o="self_attn.dense", act_in="mlp.fc1", down="mlp.fc2",
                               ln1="input_layernorm",
                               attn_branch="self_attn", mlp_branch="mlp", parallel=True),
                    note="parallel residual with one norm, partial rotary"),
    TransformerCase("Phi3", _causal("Phi3ForCausalLM", "Phi3Config", 14, num_key_value_heads=2,
                                    sliding_window=None),
                    parts=dict(blocks="model.layers", ln_final="model.norm",
                               qkv="self_attn.qkv_proj", qkv_split="cat", o="self_attn.o_proj",
                               gate_up="mlp.gate_up_proj", down="mlp.down_proj",
                               ln1="input_layernorm", ln2="post_attention_layernorm",
                               attn_branch="self_attn", mlp_branch="mlp"),
                    note="fused qkv and gate/up projections"),
    TransformerCase("OPT", _causal(
        "OPTForCausalLM", "OPTConfig", 15, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, ffn_dim=64, word_embed_proj_dim=32, vocab_size=VOCAB,
        max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        use_cache=False),
        parts=dict(blocks="model.decoder.layers", pos="model.decoder.embed_positions",
                   ln_final="model.decoder.final_layer_norm", q="self_attn.q_proj",
                   k="self_attn.k_proj", v="self_attn.v_proj", o="self_attn.out_proj",
                   act_in="fc1", down="fc2", ln1="self_attn_layer_norm",
                   ln2="final_layer_norm", attn_branch="self_attn", mlp_branch="fc2"),
        note="learned positions, an MLP inline in the block on [batch * pos, width]"),
    TransformerCase("Falcon", _causal(
        "FalconForCausalLM", "FalconConfig", 16, hidden_size=32, num_hidden_layers=2,
        num_attention_heads=4, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2,
        use_cache=False, multi_query=True, parallel_attn=True, new_decoder_architecture=False),
        parts=dict(blocks="transformer.h", ln_final="transformer.ln_f",
                   qkv="self_attention.query_key_value", qkv_split="mqa",
                   o="self_attention.dense", act_in="mlp.dense_h_to_4h",
                   down="mlp.dense_4h_to_h", ln1="input_layernorm",
                   attn_branch="self_attention", mlp_branch="mlp", parallel=True),
        note="multi-query, fused qkv, parallel residual (the MLP's output added to in place)"),
    TransformerCase("BLOOM", _causal(
        "BloomForCausalLM", "BloomConfig", 17, hidden_size=32, n_layer=2, n_head=4,
        vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0, use_cache=False),
        parts=dict(blocks="transformer.h", ln_final="transformer.ln_f",
                   qkv="self_attention.query_key_value", qkv_split="heads",
                   o="self_attention.dense", act_in="mlp.dense_h_to_4h",
                   down="mlp.dense_4h_to_h", ln1="input_layernorm",
                   ln2="post_attention_layernorm", attn_branch="self_attention.dense",
                   mlp_branch="mlp.dense_4h_to_h", alibi=True),
        note="ALiBi, eager attention on [batch * head, pos, d_head], residual adds inside "
             "attention and MLP"),
    TransformerCase("StableLM", _causal("StableLmForCausalLM", "StableLmConfig", 18,
                                        num_key_value_heads=2, partial_rotary_factor=0.5),
                    parts=LLAMA_PARTS, note="LayerNorm, partial rotary"),
    TransformerCase("OLMo", _causal("OlmoForCausalLM", "OlmoConfig", 19, clip_qkv=None),
                    parts=LLAMA_PARTS, note="LayerNorm without weights"),
    TransformerCase("OLMo2", _causal("Olmo2ForCausalLM", "Olmo2Config", 20,
                                     num_key_value_heads=2),
                    parts={**LLAMA_PARTS, **SANDWICH, "ln1": None, "ln2": None},
                    note="norms of the branches' outputs (none before them), q/k norms"),
    TransformerCase("GPTBigCode", _causal(
        "GPTBigCodeForCausalLM", "GPTBigCodeConfig", 24, n_embd=32, n_layer=2, n_head=4,
        n_positions=64, vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, use_cache=False,
        multi_query=True),
        parts=dict(blocks="transformer.h", pos="transformer.wpe", ln_final="transformer.ln_f",
                   qkv="attn.c_attn", qkv_split="cat", n_kv=1, o="attn.c_proj",
                   act_in="mlp.c_fc", down="mlp.c_proj", ln1="ln_1", ln2="ln_2",
                   attn_branch="attn", mlp_branch="mlp"),
        note="multi-query with one fused q, k, v projection, learned positions"),
    TransformerCase("Starcoder2", _causal("Starcoder2ForCausalLM", "Starcoder2Config", 25,
                                          num_key_value_heads=2, sliding_window=WINDOW),
                    parts={**LLAMA_PARTS, "act_in": "mlp.c_fc", "down": "mlp.c_proj",
                           "window": True},
                    note="LayerNorm, biases, GQA, sliding window"),
    TransformerCase("Cohere", _causal("CohereForCausalLM", "CohereConfig", 26,
                                      num_key_value_heads=2),
                    parts={**LLAMA_PARTS, "ln2": None, "parallel": True},
                    note="parallel residual with one bias-free LayerNorm, interleaved rotary"),
    TransformerCase("Granite", _causal("GraniteForCausalLM", "GraniteConfig", 27,
                                       num_key_value_heads=2, residual_multiplier=0.5,
                                       embedding_multiplier=2.0, attention_multiplier=0.25),
                    parts={**LLAMA_PARTS, "branch_scale": 0.5, "scale": 0.25},
                    note="branches scaled before the residual adds, a set attention scale"),
    TransformerCase("MPT", _causal(
        "MptForCausalLM", "MptConfig", 28, d_model=32, n_heads=4, n_layers=2,
        expansion_ratio=2, max_seq_len=64, vocab_size=VOCAB, use_cache=False),
        parts=dict(blocks="transformer.blocks", ln_final="transformer.norm_f",
                   qkv="attn.Wqkv", qkv_split="cat", o="attn.out_proj", act_in="ffn.up_proj",
                   down="ffn.down_proj", ln1="norm_1", ln2="norm_2", attn_branch="attn",
                   mlp_branch="ffn.down_proj", alibi=True),
        note="ALiBi, fused qkv, bias-free LayerNorm"),
    TransformerCase("CodeGen", _causal(
        "CodeGenForCausalLM", "CodeGenConfig", 29, n_embd=32, n_layer=2, n_head=4,
        rotary_dim=4, n_positions=64, n_ctx=64, vocab_size=VOCAB, bos_token_id=1,
        eos_token_id=2, use_cache=False),
        parts=dict(blocks="transformer.h", ln_final="transformer.ln_f", qkv="attn.qkv_proj",
                   qkv_split="codegen", o="attn.out_proj",
                   act_in="mlp.fc_in", down="mlp.fc_out", ln1="ln_1", attn_branch="attn",
                   mlp_branch="mlp", parallel=True),
        note="parallel residual, a fused qkv in model-parallel pieces, partial rotary"),
    TransformerCase("XGLM", _causal(
        "XGLMForCausalLM", "XGLMConfig", 30, d_model=32, num_layers=2, attention_heads=4,
        ffn_dim=64, vocab_size=VOCAB, max_position_embeddings=64, bos_token_id=1,
        eos_token_id=2, pad_token_id=0, use_cache=False),
        parts=dict(blocks="model.layers", ln_final="model.layer_norm", q="self_attn.q_proj",
                   k="self_attn.k_proj", v="self_attn.v_proj", o="self_attn.out_proj",
                   act_in="fc1", down="fc2", ln1="self_attn_layer_norm", ln2="final_layer_norm",
                   attn_branch="self_attn", mlp_branch="fc2"),
        note="sinusoidal positions, scaled embedding, an inline MLP"),
    TransformerCase("BERT", lambda: _encoder("BertModel", "BertConfig", 22), kind="encoder",
                    parts=BERT_PARTS, note="post-LN, padding mask"),
    TransformerCase("RoBERTa", lambda: _encoder("RobertaModel", "RobertaConfig", 23),
                    kind="encoder", parts=BERT_PARTS,
                    note="post-LN, positions counted from the ids past the padding id"),
    TransformerCase("ViT", _vit, kind="encoder",
                    parts=dict(blocks="layers", ln_final="layernorm", q="attention.q_proj",
                               k="attention.k_proj", v="attention.v_proj",
                               o="attention.o_proj", act_in="mlp.fc1", down="mlp.fc2",
                               ln1="layernorm_before", ln2="layernorm_after",
                               attn_branch="attention", mlp_branch="mlp"),
                    note="patches of pixels in (16 tokens and [CLS]), pre-LN"),
]


def _encoder(model_cls: str, config_cls: str, seed: int) -> tuple[nn.Module, dict]:
    import transformers

    options = {k: v for k, v in SMALL.items() if k not in ("bos_token_id", "eos_token_id",
                                                           "use_cache")}
    with _seeded(seed):
        model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**options),
                                                 add_pooling_layer=False)
    return model.eval(), _masked(seed)


CASES_BY_NAME = {case.name: case for case in TRANSFORMER_CASES}
