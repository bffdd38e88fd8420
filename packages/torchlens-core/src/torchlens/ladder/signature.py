"""Static facts about a model's forward signature: which names and how many positionals it takes."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class ForwardSignature:
    positional: tuple[str, ...]  # names that may be passed positionally, in order
    keyword: tuple[str, ...]  # names that may be passed by keyword
    required: tuple[str, ...]  # names without defaults (excluding self, *args, **kwargs)
    var_positional: bool
    var_keyword: bool

    def spelled_mapping(self, spec: bool = False) -> str:
        """The mapping form of input_shape= spelled with the forward's own parameter names.

        With ``spec=True`` each shape is spelled as the InputSpec override (for ambiguous dtypes).
        """
        names = self.required or self.positional[:1] or self.keyword[:1] or ("x",)
        shape = ("torchlens.types.InputSpec((...), dtype=..., low=..., high=...)" if spec
                 else "(...)")
        return "{" + ", ".join(f'"{n}": {shape}' for n in names) + "}"


def forward_signature(model: nn.Module) -> ForwardSignature:
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return ForwardSignature((), (), (), True, True)
    kinds = inspect.Parameter
    positional = tuple(p.name for p in params
                       if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD))
    keyword = tuple(p.name for p in params
                    if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY))
    required = tuple(p.name for p in params if p.default is p.empty
                     and p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD))
    return ForwardSignature(
        positional, keyword, required,
        any(p.kind is kinds.VAR_POSITIONAL for p in params),
        any(p.kind is kinds.VAR_KEYWORD for p in params),
    )
