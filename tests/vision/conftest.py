"""Shared fixtures for torchlens-vision tests: images, a seeded resnet18, tiny conv models."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

from tests.models.vision import build_resnet18


class TinyConv(nn.Module):
    """A conv + linear classifier that only runs at ``size`` x ``size`` with ``channels``."""

    def __init__(self, channels: int = 3, size: int = 32, classes: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(channels, 2, 3, padding=1)
        self.fc = nn.Linear(2 * size * size, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).flatten(1))


def make_image(seed: int = 0, size: tuple[int, int] = (48, 40), mode: str = "RGB") -> Image.Image:
    """A deterministic random image of ``size`` (width, height) in ``mode``."""
    rng = np.random.RandomState(seed)
    width, height = size
    image = Image.fromarray(rng.randint(0, 256, (height, width, 4), dtype=np.uint8), "RGBA")
    if mode == "P":
        adaptive = getattr(Image, "Palette", Image).ADAPTIVE  # (Image.Palette: Pillow 9.1+)
        return image.convert("RGB").convert("P", palette=adaptive, colors=16)
    return image.convert(mode)


@pytest.fixture(scope="session")
def resnet18() -> nn.Module:
    return build_resnet18()[0]


@pytest.fixture(scope="session")
def weights():
    from torchvision.models import ResNet18_Weights

    return ResNet18_Weights.IMAGENET1K_V1


@pytest.fixture
def tiny() -> nn.Module:
    torch.manual_seed(0)
    return TinyConv().eval()


@pytest.fixture
def image() -> Image.Image:
    return make_image()
