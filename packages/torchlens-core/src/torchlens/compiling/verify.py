"""The first compiled forward against the eager capture that placed its sites: each site's
largest absolute difference, kept for the manifest and the trace's meta; a site whose value
is missing, of another shape, or further off than the kernels' tolerance refuses, naming it."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..capture.boundaries import leaves
from ..errors import CaptureError, surface_call

RTOL = {torch.float32: 1e-3, torch.float64: 1e-6, torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _eager(trace: Any, key: str) -> list[Tensor]:
    return leaves(trace[key].out, [])


def differences(raw: dict[str, Any], located: Any, sites: list[str], training: bool,
                surface: str) -> dict[str, float | None]:
    """``sites``' largest absolute difference between the compiled ``raw`` values and the
    eager capture's (None when only shapes can be compared: a model in training mode, whose
    random ops draw other numbers compiled)."""
    found: dict[str, float | None] = {}
    for site in sites:
        want = _eager(located.trace, site)
        got = leaves(raw.get(site), [])
        if len(got) != len(want) or any(g.shape != w.shape for g, w in zip(got, want)):
            _refuse(surface, site, f"it gave {[tuple(g.shape) for g in got]} where the eager "
                                   f"capture has {[tuple(w.shape) for w in want]}")
        if training:
            found[site] = None
            continue
        worst = 0.0
        for g, w in zip(got, want):
            if not g.is_floating_point():
                if not torch.equal(g.cpu(), w.cpu()):
                    _refuse(surface, site, "its integer values differ from the eager capture's")
                continue
            diff = (g.float() - w.float()).abs().max().item() if g.numel() else 0.0
            scale = max(1.0, w.float().abs().max().item() if w.numel() else 0.0)
            if not diff <= RTOL.get(w.dtype, 1e-3) * scale:
                _refuse(surface, site, f"its values differ from the eager capture's by {diff:.3g}")
            worst = max(worst, diff)
        found[site] = worst
    return found


def _refuse(surface: str, site: str, why: str) -> None:
    raise CaptureError(f"compile=: the compiled graph cannot give {site!r} as the eager capture "
                       f"does: {why}", code="site_not_compilable",
                       teach=[surface_call(surface, "compile=False"),
                              surface_call(surface, "save=['<the module that returns it>'], "
                                                    "compile=True")])
