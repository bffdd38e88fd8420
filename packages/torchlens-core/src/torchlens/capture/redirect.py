"""A model's calls sent through TorchLens for a while: ``model.forward`` becomes an instance
attribute that hands each top-level call to ``route(args, kwargs)``; the calls ``route`` makes
of the model (a capture runs it) reach the model's own forward. ``remove()`` puts the model's
own ``forward`` back (an instance attribute it had, or none). Used by step runs and by captum
op sites."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from torch import nn


class Redirect:
    """``model.forward`` routed through ``route`` until ``remove()``."""

    def __init__(self, model: nn.Module, route: Callable[[tuple, dict], Any]):
        self.model = model
        self.had_own = "forward" in model.__dict__
        self.original = original = model.forward
        inside = [False]

        @functools.wraps(original)  # generate() reads the forward's signature
        def forward(*args: Any, **kwargs: Any) -> Any:
            if inside[0]:  # the capture's own call of the model
                return original(*args, **kwargs)
            inside[0] = True
            try:
                return route(args, kwargs)
            finally:
                inside[0] = False

        model.forward = forward

    def remove(self) -> None:
        if self.had_own:
            self.model.forward = self.original
        else:
            del self.model.forward
