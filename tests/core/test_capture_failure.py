"""A forward that raises leaves nothing behind and says where it broke, with the partial trace."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(5, 2)  # wrong width: fails on the second linear

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _no_hooks(model: nn.Module) -> bool:
    from torch.nn.modules import module as torch_module

    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return False
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_error_names_the_op_and_carries_the_partial_trace():
    model = Broken()
    with pytest.raises(RuntimeError) as err:
        tl.trace(model, torch.rand(2, 4))
    exc = err.value
    note = " ".join(getattr(exc, "__notes__", []))
    assert "'linear'" in note and "'fc2'" in note and "(inputs 2×8" in note
    partial = exc.partial_trace
    assert [op.label for op in partial] == ["input_1", "linear_1", "relu_1"]
    assert partial.meta["partial"] is True
    assert exc.torchlens_failure["module"] == "fc2"


def test_nothing_left_behind_after_a_failed_forward():
    model = Broken()
    with pytest.raises(RuntimeError):
        tl.trace(model, torch.rand(2, 4))
    assert _no_hooks(model)
    assert not torch._C._is_torch_function_mode_enabled()
    model.fc2 = nn.Linear(8, 2)
    with torch.no_grad():
        plain = model(torch.ones(1, 4))
    trace = tl.trace(model, torch.ones(1, 4))
    assert torch.equal(trace.output, plain)
    assert _no_hooks(model)


class NoAddNote(ValueError):
    """An error without ``BaseException.add_note``, as every error is on Python 3.10."""

    def __getattribute__(self, name):
        if name == "add_note":
            raise AttributeError(name)
        return super().__getattribute__(name)


@pytest.mark.parametrize("error", [ValueError, NoAddNote])
def test_python_error_outside_a_torch_call(error):
    """The note names the last op; without ``add_note`` it still reaches ``__notes__``."""
    class Raises(nn.Module):
        def forward(self, x):
            x = x + 1
            raise error("boom")

    with pytest.raises(error) as err:
        tl.trace(Raises(), torch.rand(2))
    assert "after op 'add_1'" in " ".join(err.value.__notes__)
    assert len(err.value.partial_trace) == 2

