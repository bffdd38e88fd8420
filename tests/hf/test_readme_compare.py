"""The README's compare section runs as written (a GPT-2 built from a config)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_compare_section_runs(capsys, tmp_path, monkeypatch):
    text = README.read_text()
    start, end = text.index("## Compare two runs"), text.index("## Recording a dataset")
    blocks = re.findall(r"```python\n(.*?)\n```", text[start:end], flags=re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(blocks[0], "README.md (compare block)", "exec"), scope)
    first, changed = scope["first"], scope["what_changed"]
    assert first.func == "embedding" and first.status == "changed"
    assert changed.first_divergence().module == "transformer.h.1.mlp.dropout"
    out = capsys.readouterr().out
    assert "Comparison: model_a (GPT2LMHeadModel) vs model_b (GPT2LMHeadModel)" in out
    assert "first divergence: embedding_1 in transformer.wte" in out
    assert (tmp_path / "diff.html").exists()
