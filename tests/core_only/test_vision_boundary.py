"""Core alone refuses an image with a teach naming torchlens-vision, before any forward runs.

Core detects images by module name, so a stand-in whose class lives in "PIL.Image" works without
PIL installed; the vision plugin claims only real ``PIL.Image.Image`` instances, so this test
passes in the full env too.
"""

from __future__ import annotations

import pytest
from torch import nn

import torchlens as tl


class FakeImage:
    """Looks like a PIL image to core's module-name check; is not one."""

    size = (8, 8)
    mode = "RGB"


FakeImage.__module__ = "PIL.Image"


def _counted_model() -> tuple[nn.Module, list[int]]:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())
    calls: list[int] = []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    return model, calls


@pytest.mark.parametrize("value", [FakeImage(), [FakeImage(), FakeImage()]], ids=["one", "list"])
def test_image_without_a_resolver_refuses_with_the_vision_teach(value):
    model, calls = _counted_model()
    with pytest.raises(tl.TorchLensError) as info:
        tl.trace(model, value)
    assert info.value.code == "input_unresolved"
    assert any("pip install torchlens-vision" in t for t in info.value.teach)
    assert calls == []  # refused before any forward
