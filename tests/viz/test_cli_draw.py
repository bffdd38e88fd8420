"""``torchlens draw`` writes the drawing through the installed renderer."""

from __future__ import annotations

import subprocess
import sys


def test_draw_writes_the_file(tmp_path):
    (tmp_path / "zoo_models.py").write_text(
        "import torch.nn as nn\n"
        "def mlp():\n"
        "    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))\n")
    out = subprocess.run([sys.executable, "-m", "torchlens.cli", "draw", "zoo_models:mlp",
                          "--input-shape", "1,4", "-o", "g.svg"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "g.svg").read_text().lstrip().startswith(("<?xml", "<svg"))
