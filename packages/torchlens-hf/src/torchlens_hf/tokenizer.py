"""Find the model's own tokenizer or processor, and describe it for the provenance record.

Lookup order: the verb's ``tokenizer=`` / ``processor=``, an attached ``model.tokenizer`` /
``model.processor``, then ``Auto*.from_pretrained(model.name_or_path, local_files_only=True)``.
Never a hub download, never a stand-in tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from torch import nn

from torchlens.errors import InputError

# Files whose presence proves a local folder holds a real tokenizer (transformers 5 would
# otherwise build an empty one from config.json alone).
_TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model",
                    "sentencepiece.bpe.model", "tokenizer.model", "merges.txt")
_PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


def _path(model: nn.Module) -> str:
    return str(getattr(model, "name_or_path", "") or "")


def _local_folder_lacks(path: str, names: tuple[str, ...]) -> bool:
    return os.path.isdir(path) and not any(os.path.exists(os.path.join(path, n)) for n in names)


def tokenizer_teach(surface: str, path: str) -> list[str]:
    """The exact remedies when no tokenizer is found, best first."""
    where = repr(path) if path else '"path/or/hub-id"'
    return [
        f"tl.{surface}(model, text, tokenizer=AutoTokenizer.from_pretrained({where}))",
        "model.tokenizer = tok  # attach it once; every surface then finds it",
        f'tl.{surface}(model, tok(text, return_tensors="pt"))  # or pass the tensors yourself',
    ]


def find_tokenizer(model: nn.Module, options: dict[str, Any], surface: str = "trace",
                   *, required: bool = True) -> tuple[Any, str] | tuple[None, None]:
    """The tokenizer and where it came from ('option', 'attribute', 'name_or_path')."""
    if options.get("tokenizer") is not None:
        return options["tokenizer"], "option"
    attached = getattr(model, "tokenizer", None)
    if attached is not None and callable(attached):
        return attached, "attribute"
    processor = options.get("processor") or getattr(model, "processor", None)
    if processor is not None and getattr(processor, "tokenizer", None) is not None:
        return processor.tokenizer, "processor"
    path = _path(model)
    tok, why = _load_offline("AutoTokenizer", path, _TOKENIZER_FILES, "tokenizer")
    if tok is not None:
        if len(tok) > len(getattr(tok, "all_special_ids", [])):
            return tok, "name_or_path"
        why = f"the tokenizer found at {path!r} has no vocabulary beyond special tokens"
    if not required:
        return None, None
    raise InputError(
        f"{type(model).__name__} got text, but no tokenizer was passed (tokenizer=), attached "
        f"(model.tokenizer) or found offline: {why}", code="tokenizer_unavailable",
        teach=tokenizer_teach(surface, path))


def find_processor(model: nn.Module, options: dict[str, Any], surface: str = "trace"
                   ) -> tuple[Any, str]:
    """The model's multimodal processor and where it came from, or ``processor_unavailable``."""
    if options.get("processor") is not None:
        return options["processor"], "option"
    attached = getattr(model, "processor", None)
    if attached is not None and callable(attached):
        return attached, "attribute"
    path = _path(model)
    processor, why = _load_offline("AutoProcessor", path, _PROCESSOR_FILES, "processor")
    if processor is not None:
        return processor, "name_or_path"
    where = repr(path) if path else '"path/or/hub-id"'
    raise InputError(
        f"{type(model).__name__} got a modality dict, but no processor was passed (processor=), "
        f"attached (model.processor) or found offline: {why}", code="processor_unavailable",
        teach=[f"tl.{surface}(model, inputs, processor=AutoProcessor.from_pretrained({where}))",
               "model.processor = processor  # attach it once",
               f'tl.{surface}(model, processor(text=..., images=..., return_tensors="pt"))'])


def _load_offline(loader: str, path: str, files: tuple[str, ...], what: str
                  ) -> tuple[Any, str]:
    """``transformers.<loader>.from_pretrained(path)`` offline, or None and why it failed."""
    if not path:
        return None, "the model has no name_or_path (built from a config)"
    if _local_folder_lacks(path, files):
        return None, f"{path!r} holds no {what} files"
    import transformers

    try:
        return getattr(transformers, loader).from_pretrained(path, local_files_only=True), ""
    except Exception as exc:  # any loader failure means "not found"
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return None, f"{loader}.from_pretrained({path!r}, local_files_only=True) failed: {detail}"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tokenizer_state_hash(tok: Any) -> tuple[str, str]:
    """A sha256 of the tokenizer's serialized state and what was hashed."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        return _sha256(backend.to_str()), "backend_tokenizer.to_str()"
    vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else {}
    return _sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False)), "sorted get_vocab()"


def special_tokens_added(tok: Any, text: str) -> dict[str, Any]:
    """Which tokens the tokenizer adds around ``text`` (compared with add_special_tokens=False)."""
    with_special = list(tok(text)["input_ids"])
    plain = list(tok(text, add_special_tokens=False)["input_ids"])
    start = next((i for i in range(len(with_special) - len(plain) + 1)
                  if with_special[i:i + len(plain)] == plain), None)
    if start is None:  # the template rewrote the text's own tokens: report the whole difference
        prefix, suffix = with_special, []
    else:
        prefix, suffix = with_special[:start], with_special[start + len(plain):]
    to_tokens = tok.convert_ids_to_tokens
    bos, eos = getattr(tok, "bos_token_id", None), getattr(tok, "eos_token_id", None)
    return {
        "prefix": to_tokens(prefix), "suffix": to_tokens(suffix),
        "bos": bos is not None and bos in prefix, "eos": eos is not None and eos in suffix,
    }


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def tokenizer_facts(tok: Any, source: str, sample_text: str) -> dict[str, Any]:
    """JSON-safe facts about one tokenizer: identity, vocab, padding, specials and a hash."""
    digest, hashed = tokenizer_state_hash(tok)
    return {
        "class": type(tok).__name__,
        "module": type(tok).__module__,
        "source": source,
        "name_or_path": str(getattr(tok, "name_or_path", "") or ""),
        "vocab_size": len(tok) if hasattr(tok, "__len__") else getattr(tok, "vocab_size", None),
        "base_vocab_size": getattr(tok, "vocab_size", None),
        "padding_side": getattr(tok, "padding_side", None),
        "truncation_side": getattr(tok, "truncation_side", None),
        "special_tokens": _jsonable(getattr(tok, "special_tokens_map", {})),
        "special_tokens_added": special_tokens_added(tok, sample_text),
        "sha256": digest,
        "hashed": hashed,
    }


def processor_facts(processor: Any, source: str) -> dict[str, Any]:
    """JSON-safe facts about a multimodal processor: classes, its config and a hash of it."""
    image_processor = getattr(processor, "image_processor", None)
    config = image_processor.to_dict() if hasattr(image_processor, "to_dict") else {}
    config = _jsonable(config)
    return {
        "class": type(processor).__name__,
        "source": source,
        "image_processor": type(image_processor).__name__ if image_processor else None,
        "image_processor_config": config,
        "sha256": _sha256(json.dumps(config, sort_keys=True)),
    }
