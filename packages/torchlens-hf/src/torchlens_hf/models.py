"""Static facts about a transformers model: is it one, its modality, head, vocab and signature.

Detection walks the class's MRO by module name, so a non-HF model never imports transformers.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

_PARAM_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def is_hf_model(model: Any) -> bool:
    """True for a transformers ``PreTrainedModel`` (checked without importing transformers)."""
    return isinstance(model, nn.Module) and any(
        c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.")
        for c in type(model).__mro__)


def forward_params(model: nn.Module) -> tuple[str, ...]:
    """The explicitly named parameters of ``model.forward`` (no ``*args``/``**kwargs``)."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params if p.kind in _PARAM_KINDS)


def sub_config(model: nn.Module, name: str) -> Any:
    """``config.<name>`` (e.g. ``text_config``), or the config itself when it has none."""
    config = model.config
    return getattr(config, name, None) or config


def is_dual_tower(model: nn.Module) -> bool:
    """A CLIP-like model: a text tower and a vision tower in one forward."""
    config = model.config
    params = forward_params(model)
    return (getattr(config, "text_config", None) is not None
            and getattr(config, "vision_config", None) is not None
            and "input_ids" in params and "pixel_values" in params)


def modality(model: nn.Module) -> str:
    """'text', 'vision', 'text+vision' or 'other', from the main input and the config."""
    if is_dual_tower(model):
        return "text+vision"
    main = getattr(model, "main_input_name", "input_ids")
    if main == "input_ids":
        return "text"
    if main == "pixel_values":
        return "vision"
    return "other"


def vocab_size(model: nn.Module) -> int | None:
    """Ids below this fit the model: the input embedding's rows, bounded by ``vocab_size``."""
    sizes = []
    try:
        emb = model.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        emb = None
    if isinstance(emb, nn.Embedding):
        sizes.append(emb.num_embeddings)
    config_size = getattr(sub_config(model, "text_config"), "vocab_size", None)
    if isinstance(config_size, int) and config_size > 0:
        sizes.append(config_size)
    return min(sizes) if sizes else None


def max_positions(model: nn.Module) -> int | None:
    """The longest sequence the text tower's position table holds (None: unbounded/relative)."""
    config = sub_config(model, "text_config")
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


_HEADS = (  # (kind, the transformers auto-mapping listing model classes of that head)
    ("causal_lm", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("seq2seq_lm", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("masked_lm", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("sequence_classification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    ("token_classification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    ("image_classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("base", "MODEL_MAPPING_NAMES"),
)
_SUFFIXES = (
    ("causal_lm", ("ForCausalLM", "LMHeadModel")),
    ("seq2seq_lm", ("ForConditionalGeneration",)),
    ("masked_lm", ("ForMaskedLM",)),
    ("sequence_classification", ("ForSequenceClassification",)),
    ("token_classification", ("ForTokenClassification",)),
    ("image_classification", ("ForImageClassification",)),
)


def head_kind(model: nn.Module) -> str:
    """What the output means: a ``_HEADS`` kind, 'image_text_similarity' (CLIP) or 'other'."""
    from transformers.models.auto import modeling_auto

    name = type(model).__name__
    if is_dual_tower(model):
        return "image_text_similarity"
    for kind, mapping in _HEADS:
        names = getattr(modeling_auto, mapping, {}).values()
        if any(name == n or (isinstance(n, tuple) and name in n) for n in names):
            return kind
    for kind, suffixes in _SUFFIXES:
        if name.endswith(suffixes):
            return kind
    return "base" if name.endswith("Model") else "other"


def load_folder(path: str, meta: bool = False) -> nn.Module | None:
    """The model class named in the folder's config (``architectures``), loaded offline, eval;
    its tokenizer is attached when the folder has one. With ``meta`` (also for a bare
    ``config.json``) the model is built from the config on the meta device: no weights read.
    None when it is not an HF folder or config."""
    import os

    config_file = path if os.path.isfile(path) else os.path.join(path, "config.json")
    if not os.path.isfile(config_file) or not config_file.endswith(".json"):
        return None
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(config_file, local_files_only=True)
    except (OSError, ValueError):
        return None
    names = getattr(config, "architectures", None) or []
    cls = getattr(transformers, names[0], None) if names else None
    cls = cls or transformers.AutoModel
    if meta or os.path.isfile(path):
        return _on_meta(cls, config)
    model = cls.from_pretrained(path, local_files_only=True).eval()
    try:
        model.tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError, KeyError):
        # no tokenizer in the folder (transformers 4 says so with a KeyError for a config with
        # no tokenizer class): --text will refuse with tokenizer_unavailable
        pass
    return model


def _on_meta(cls: Any, config: Any) -> nn.Module:
    """The model built from its config on the meta device, in the config's dtype."""
    dtype = getattr(config, "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    with torch.device("meta"):
        model = cls._from_config(config) if hasattr(cls, "_from_config") else cls(config)
    if isinstance(dtype, torch.dtype):
        model = model.to(dtype)
    return model.eval()


def tied_parameters(model: nn.Module) -> dict[str, str] | None:
    """``{alias: source}`` of the weights a transformers model ties (its config decides: an
    untied ``tie_word_embeddings=False`` model declares none), or None for other models."""
    if not is_hf_model(model):
        return None
    ties = getattr(model, "all_tied_weights_keys", None)
    if ties is None and hasattr(model, "get_expanded_tied_weights_keys"):
        ties = model.get_expanded_tied_weights_keys(all_submodels=True)
    return dict(ties) if isinstance(ties, dict) else None
