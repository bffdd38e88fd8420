"""The README's edits recipe runs as written (a GPT-2 built from a config)."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_edits_recipe_runs(capsys):
    text = README.read_text()
    section = text[text.index("## Edits: ablate, steer, patch"):]
    start = section.index("```python\n") + 10
    block = section[start:section.index("\n```", start)]
    scope: dict = {}
    exec(compile(block, "README.md (edits recipe)", "exec"), scope)
    steered, patched, clean = scope["steered"], scope["patched"], scope["clean"]
    assert len(steered.edits) == 4 and all(row["fired"] for row in steered.edits)
    assert "transformer.h.*" in capsys.readouterr().out
    assert patched.edits[0]["index"] == "[:, 4]" and clean.edits == []
    for name in ("ablated", "resid", "mean_ablated"):
        assert scope[name].edited and scope[name].edits[0]["norm"] > 0
