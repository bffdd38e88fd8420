"""torchvision models for the TorchLens test zoo (torchvision is imported lazily)."""

from __future__ import annotations

import torch
from torch import nn

from .zoo import ZooCase, seeded

__all__ = ["VISION_CASES", "build_resnet18"]


def build_resnet18() -> tuple[nn.Module, object]:
    """torchvision resnet18 with random weights (no download), eval mode, 1x3x224x224 input."""
    import torchvision

    with seeded(100):
        model = torchvision.models.resnet18(weights=None)
        x = torch.rand(1, 3, 224, 224)
    return model.eval(), x


VISION_CASES: dict[str, ZooCase] = {
    "resnet18": ZooCase(
        "resnet18",
        build_resnet18,
        needs=frozenset({"torchvision"}),
        # resnet's ReLUs are inplace=True and blocks do `out += identity`, so "relu", "bn1",
        # "layerN.M.bn2" etc. (whose outputs are later mutated in place) are deliberately absent.
        module_outputs=(
            "conv1",
            "maxpool",
            "layer1.0.conv1",
            "layer2.0.downsample",
            "avgpool",
            "fc",
        ),
    ),
}
