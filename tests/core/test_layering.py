"""The house: data flows one way (input -> capture -> Trace -> surfaces); the Trace never imports
a surface, not even inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import torchlens as tl
from tests.models.zoo import PURE_CASES

SRC = Path(tl.__file__).parent
SURFACES = {"verbs", "storage", "summary", "recording", "validation", "debug", "cli", "ladder",
            "capture"}


def imported_modules(path: Path) -> set[str]:
    """Every torchlens module a file imports, at module level or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            found.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchlens."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names
                         if a.name.startswith("torchlens."))
    return found


def test_trace_imports_no_surface_and_no_capture():
    assert not imported_modules(SRC / "trace.py") & SURFACES


def test_the_trace_file_writer_does_not_import_the_trace():
    """The Trace saves through ``tracefile`` (which knows no Trace class); ``storage`` reads files
    back into Traces: one direction each, no circle."""
    assert "trace" not in imported_modules(SRC / "tracefile.py")
    assert "trace" in imported_modules(SRC / "storage.py")


def test_run_save_and_load_behave_as_before(tmp_path):
    """The public behaviour across the cut: trace.run re-traces, trace.save / tl.load round-trip,
    and a loaded trace still refuses run (model_unavailable)."""
    model, x = PURE_CASES["mlp"].build()
    first = tl.trace(model, x)
    again = first.run(x * 2)
    with torch.no_grad():
        assert torch.allclose(again.output, model(x * 2))
    first.save(tmp_path / "t.tl")
    loaded = tl.load(tmp_path / "t.tl")
    assert [op.row() for op in loaded] == [op.row() for op in first]
    with pytest.raises(tl.TorchLensError) as err:
        loaded.run(x)
    assert err.value.code == "model_unavailable"
