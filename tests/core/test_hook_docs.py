"""Every hook spec is documented in docs/plugins.md with its exact signature, and has a test."""

from __future__ import annotations

import inspect
from pathlib import Path

from torchlens import hookspecs

ROOT = Path(__file__).resolve().parents[2]
SPECS = {n: f for n, f in vars(hookspecs).items() if n.startswith("torchlens_")}


def test_every_hook_documented_with_its_signature():
    doc = (ROOT / "docs" / "plugins.md").read_text()
    for name, spec in SPECS.items():
        signature = f"`{name}({', '.join(inspect.signature(spec).parameters)})`"
        assert signature in doc, signature
        firstresult = spec.torchlens_spec["firstresult"]
        row = next(line for line in doc.splitlines() if signature in line)
        assert ("| yes |" in row) == firstresult, name


def test_every_hook_has_a_test_that_names_it():
    text = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py")
                     if p.name != "test_hook_docs.py")
    text += "\n".join(p.read_text() for p in (ROOT / "tests").rglob("conftest.py"))
    for name in SPECS:
        assert name in text, f"no test names {name}"
