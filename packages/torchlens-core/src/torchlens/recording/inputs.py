"""Inputs for the command line's ``record``: prompts from a text file, or a folder of images."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


class ImageFolder(Sequence):
    """The images of a folder in name order, each opened only when it is recorded."""

    def __init__(self, paths: list[Path]):
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return ImageFolder(self.paths[i])
        from PIL import Image

        with Image.open(self.paths[i]) as image:
            image.load()
            return image


def read_inputs(path: str) -> list[str] | ImageFolder:
    """Prompts (one a line, blank lines skipped) or the image files of a folder."""
    source = Path(path)
    if source.is_dir():
        images = sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise InputError(f"{source} holds no image files ({', '.join(sorted(IMAGE_SUFFIXES))})",
                             code="inputs_empty", teach=["torchlens record MODEL --inputs "
                                                         "prompts.txt --save LABEL --to acts/"])
        try:
            import PIL  # noqa: F401
        except ImportError:
            raise InputError("a folder of images needs Pillow and torchlens-vision",
                             code="input_unresolved",
                             teach=["pip install torchlens-vision"]) from None
        return ImageFolder(images)
    try:
        lines = source.read_text().splitlines()
    except OSError as exc:
        raise InputError(f"--inputs {path}: {exc.strerror or exc}", code="inputs_empty",
                         teach=["torchlens record MODEL --inputs prompts.txt --save LABEL "
                                "--to acts/"]) from None
    return [line for line in lines if line.strip()]
