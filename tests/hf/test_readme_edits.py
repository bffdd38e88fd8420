"""The README's edits section runs as written: the recipe (a GPT-2 built from a config), then
the push and sweep examples in the same scope."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_edits_section_runs(capsys, tmp_path, monkeypatch):
    text = README.read_text()
    start = text.index("## Edits: ablate, steer, patch")
    end = text.index("## Gradients and attribution")
    section = text[start:end]
    blocks = re.findall(r"```python\n(.*?)\n```", section, flags=re.S)
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    for n, block in enumerate(blocks):
        exec(compile(block, f"README.md (edits block {n + 1})", "exec"), scope)
    steered, patched, clean = scope["steered"], scope["patched"], scope["clean"]
    assert len(steered.edits) == 4 and all(row["fired"] for row in steered.edits)
    out = capsys.readouterr().out
    assert "transformer.h.*" in out and "Patching sweep: 4 sites x 12 positions" in out
    assert patched.edits[0]["index"] == "[:, 4]" and clean.edits == []
    for name in ("ablated", "resid", "mean_ablated", "pushed"):
        assert scope[name].edited and scope[name].edits[0]["norm"] > 0
    assert (tmp_path / "grid.html").exists()
