"""The TorchLens demo: trace, summarize and draw a real torchvision model (random weights).

Run with ``hatch run demo:run``; it writes ``resnet18-graph.svg`` into the current folder.
"""

from __future__ import annotations

import torch
import torchvision

import torchlens as tl


def main() -> None:
    model = torchvision.models.resnet18(weights=None).eval()
    x = torch.rand(1, 3, 224, 224)

    trace = tl.trace(model, x)  # rung 1: your real input
    print(trace)
    print(trace["layer1.0.conv1"].calls[0], trace["conv2d_1"])
    print()
    print(tl.summary(model, input_shape=(1, 3, 224, 224), depth=2))  # rung 2: declared shape
    print()
    drawing = tl.draw(model, path="resnet18-graph.svg", file_format="svg")  # rung 3: inferred
    print(drawing)


if __name__ == "__main__":
    main()
