"""``torch.compile``d code runs as written while captured: every op reaches the recorder and
the capture compiles nothing (no graph-break warnings, no graphs or recompiles left behind).

The compiler's stance is process-wide, so the first capture to start sets it and the last to
end puts back what was there: captures in several threads overlap. While one runs, compiled
code in other threads runs eagerly too.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_open = 0  # captures running
_restore: Any = None  # the stance setter whose exit puts the previous stance back


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Run the body with ``torch.compile`` set to ``force_eager``."""
    global _open, _restore
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:  # never imported: nothing can have been compiled
        yield
        return
    with _lock:
        if _open == 0:
            try:
                _restore = dynamo.set_stance("force_eager")  # set now; its exit restores
            except RuntimeError:  # called inside a compiled region, where it cannot change
                _restore = None
        _open += 1
    try:
        yield
    finally:
        with _lock:
            _open -= 1
            if _open == 0 and _restore is not None:
                _restore.__exit__(None, None, None)
                _restore = None
