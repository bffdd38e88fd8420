"""tl.draw refuses a bad edit typed, its teach the user's own draw call corrected (the
renderers come with torchlens-viz, so this lives with the viz tests)."""

from __future__ import annotations

import ast

import pytest
import torch

import torchlens as tl


def test_a_draw_with_an_edit_out_of_range_teaches_the_draw_call():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    with pytest.raises(tl.TorchLensError) as err:
        tl.draw(model, torch.rand(2, 6), edits={"2": tl.edits.zero(index=(slice(None), 5))},
                file_format="dot")
    assert err.value.code == "edit_index_out_of_range"
    teach = err.value.teach[0]
    ast.parse(teach)
    assert teach.startswith("tl.draw(model, x, edits="), teach
