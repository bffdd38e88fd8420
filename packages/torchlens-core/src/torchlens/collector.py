"""Python's cyclic garbage collector, paused while a capture allocates.

A capture makes thousands of small objects that live until it ends and form no reference
cycles. Left running, the collector traverses them again and again mid-forward and promotes them
towards the oldest generation, whose full collections (over every object of the process) then
come sooner: on a launch-bound model that costs more than the capture itself. Pausing it for the
length of a capture skips that work; it is re-enabled on exit exactly as it was found.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Disable automatic collection in the body; restore the caller's setting after."""
    was_enabled = gc.isenabled()
    if was_enabled:
        gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
