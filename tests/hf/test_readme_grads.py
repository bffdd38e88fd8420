"""The README's gradients section runs as written (a GPT-2 built from a config)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_gradients_section_runs(capsys, tmp_path, monkeypatch):
    text = README.read_text()
    start = text.index("## Gradients and attribution")
    end = text.index("## Generation and loops")
    blocks = re.findall(r"```python\n(.*?)\n```", text[start:end], flags=re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(blocks[0], "README.md (gradients block)", "exec"), scope)
    assert scope["per_position"].shape == (1, 12)
    assert scope["blocked"].edits[0]["kind"] == "zero (grad)"
    assert scope["attributions"].shape == (1, 12, 64) and abs(float(scope["delta"])) < 0.1
    assert scope["estimate"].values.shape == (4, 12)
    assert torch.all(scope["estimate"].values[:, :4] == 0)  # causal: nothing before position 4
    out = capsys.readouterr().out
    assert "grad norm" in out and "Attribution patching" in out and "Grad norm" in out
    assert (tmp_path / "grads.html").exists()
