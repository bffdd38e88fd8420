"""Render the drawing gallery: resnet18, tiny GPT-2 and the recurrent zoo model, auto and none.

Run from the repository root: ``python docs/gallery/make_gallery.py`` (needs torchvision,
transformers, torchlens-viz and Graphviz's ``dot``). Writes PNGs next to this file, or into
``--out DIR`` (the documentation build's own copies).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root, for tests.models

import torch  # noqa: E402

import torchlens as tl  # noqa: E402


def resnet18():
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval(), torch.randn(1, 3, 224, 224)


def zoo(name: str):
    from tests.models import CASES

    return lambda: CASES[name].build()


MODELS = {"resnet18": resnet18, "gpt2_tiny": zoo("gpt2_tiny"), "recurrent": zoo("recurrent")}
DRAWINGS = [  # (model, file stem, draw options)
    ("resnet18", "resnet18-auto", {"collapse": "auto"}),
    ("resnet18", "resnet18-none", {"collapse": "none"}),
    ("gpt2_tiny", "gpt2_tiny-auto", {"collapse": "auto"}),
    ("gpt2_tiny", "gpt2_tiny-none", {"collapse": "none"}),
    ("recurrent", "recurrent-auto", {"collapse": "auto"}),
    ("recurrent", "recurrent-none", {"collapse": "none"}),
    ("recurrent", "recurrent-rolled", {"collapse": "none", "roll_recurrent": True}),
]


def main(only: list[str], out: Path = HERE) -> None:
    out.mkdir(parents=True, exist_ok=True)
    traces = {}
    for model_name, stem, options in DRAWINGS:
        if only and stem not in only and model_name not in only:
            continue
        if model_name not in traces:
            model, x = MODELS[model_name]()
            traces[model_name] = tl.trace(model, x, save="none")
        drawing = traces[model_name].draw(path=out / f"{stem}.png", **options)
        shrink(drawing.path)
        size = drawing.path.stat().st_size
        print(f"{drawing.path.name}: {drawing.stats['nodes']} nodes, {size / 1024:.0f} KB")


def shrink(path: Path) -> None:
    """Re-save the PNG with a 64-colour palette (a third of the size, text stays crisp)."""
    try:
        from PIL import Image
    except ImportError:  # pillow is optional: keep dot's PNG as it is
        return
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" in args:
        at = args.index("--out")
        main(args[:at] + args[at + 2:], Path(args[at + 1]))
    else:
        main(args)
