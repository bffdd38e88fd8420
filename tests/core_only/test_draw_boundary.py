"""With core alone (no renderer plugin), drawing refuses with the install teach."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import torchlens as tl


def test_cli_draw_refuses_without_a_renderer(tmp_path):
    (tmp_path / "m.py").write_text("import torch.nn as nn\nmodel = nn.Linear(4, 2)\n")
    env = {**os.environ, "TORCHLENS_DISABLE_PLUGINS": "1"}
    out = subprocess.run([sys.executable, "-m", "torchlens.cli", "draw", "m:model",
                          "--input-shape", "1,4", "-o", "g.svg"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 3
    assert "renderer_unavailable" in out.stderr and "pip install torchlens-viz" in out.stderr
    assert not (tmp_path / "g.svg").exists()


def test_draw_refuses_typed_without_a_renderer():
    from torchlens.plugins import get_plugin_manager

    pm = get_plugin_manager()
    removed = [(name, plugin) for name, plugin in pm.list_name_plugin()
               if plugin is not None and hasattr(plugin, "torchlens_renderers")]
    for _, plugin in removed:
        pm.unregister(plugin)
    try:
        with pytest.raises(tl.TorchLensError) as err:
            tl.draw(nn.Linear(4, 2), torch.rand(1, 4))
        assert err.value.code == "renderer_unavailable"
        assert "pip install torchlens-viz" in err.value.teach
    finally:
        for name, plugin in removed:
            pm.register(plugin, name=name)
