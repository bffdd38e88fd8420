"""The README's generation-and-loops section runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_steps_section_runs(capsys):
    text = README.read_text()
    start, end = text.index("## Generation and loops"), text.index("## Compare two runs")
    blocks = re.findall(r"```python\n(.*?)\n```", text[start:end], flags=re.S)
    assert len(blocks) == 2
    scope: dict = {}
    for n, block in enumerate(blocks):
        exec(compile(block, f"README.md (steps block {n + 1})", "exec"), scope)
    run, gen = scope["run"], scope["gen"]
    assert len(run) == 6 and run.captured == [0, 2, 4]
    assert scope["states"].shape == (3, 2, 5)
    assert len(gen) == 6 and len(gen.tokens) == 6
    assert sorted({row["step"] for row in gen.edits}) == [1, 2]
    out = capsys.readouterr().out
    assert "Steps of GRUCell: 6 call(s), 3 captured, 1 distinct graph(s)" in out
