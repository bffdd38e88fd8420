"""The one registry through which the Trace reaches the capabilities built above it.

The Trace is a data model: it imports nothing above itself. Its methods that run a capability
(``trace.draw``, ``trace.push``, ``trace.backward``, ``trace.grads``) are thin entry points that
look the capability up here at call time; each capability provides its entry when its module is
imported (``import torchlens`` imports them all)::

    @capabilities.provide("push")
    def push(trace, edits, allow_unfired=False): ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import TorchLensError

_provided: dict[str, Callable[..., Any]] = {}


def provide(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the capability ``name``."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        _provided[name] = fn
        return fn

    return register


def lookup(name: str) -> Callable[..., Any]:
    """The function providing capability ``name``; refuses typed when no module provides it."""
    fn = _provided.get(name)
    if fn is None:
        raise TorchLensError(f"no installed module provides the capability {name!r}",
                             code="dependency_missing", teach=["import torchlens"])
    return fn
