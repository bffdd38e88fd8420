"""Shared test model zoo for TorchLens.

``CASES`` maps a case name to a :class:`ZooCase`. Importing this package needs only torch:
cases that need torchvision or transformers import them lazily inside ``build`` and list
them in ``ZooCase.needs``.
"""

from __future__ import annotations

from .hf import HF_CASES
from .vision import VISION_CASES
from .zoo import PURE_CASES, ZooCase, call_model

CASES: dict[str, ZooCase] = {**PURE_CASES, **VISION_CASES, **HF_CASES}

__all__ = ["CASES", "ZooCase", "call_model"]
