"""The plugin boundary: a string for a model no installed plugin resolves refuses with a teach.

Runs in the core-only env (no torchlens-hf) and in the full env (torchlens-hf declines a
non-HF model), so it must not import transformers.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.errors import TorchLensError


class TokenModel(nn.Module):
    """A plain module that takes token ids."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 50)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(input_ids))


@pytest.mark.parametrize("text", ["The quick brown fox", ["a batch", "of prompts"]])
def test_string_refuses_input_unresolved_with_the_install_teach(text):
    with pytest.raises(TorchLensError) as info:
        tl.trace(TokenModel(), text)
    err = info.value
    assert err.code == "input_unresolved"
    assert err.teach[0].startswith("pip install torchlens-hf")
    assert any("tokenizer=tokenizer" in t for t in err.teach)
    assert any('return_tensors="pt"' in t for t in err.teach)
