"""The ``torchlens`` command line, run as a subprocess: output and exit codes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import torchlens as tl
from tests.models.zoo import PURE_CASES


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "torchlens.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture()
def project(tmp_path):
    (tmp_path / "zoo_models.py").write_text(textwrap.dedent("""
        import torch.nn as nn
        def mlp():
            return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        def two_inputs():
            class Two(nn.Module):
                def forward(self, a, b):
                    return a + b
            return Two()
        instance = mlp()
    """))
    return tmp_path


def test_summary_with_declared_shape(project):
    out = run("summary", "zoo_models:mlp", "--input-shape", "2,4", cwd=project)
    assert out.returncode == 0, out.stderr
    assert "Input: declared" in out.stdout and "Total params: 58" in out.stdout


def test_summary_inferred_and_module_instance(project):
    out = run("summary", "zoo_models:instance", cwd=project)
    assert out.returncode == 0 and "Input: inferred" in out.stdout


def test_show_a_saved_trace(project):
    model, x = PURE_CASES["mlp"].build()
    tl.trace(model, x).save(project / "t.tl")
    out = run("show", "t.tl", cwd=project)
    assert out.returncode == 0 and "linear_1" in out.stdout and "Input: gold" in out.stdout


def test_exit_codes(project):
    refused = run("summary", "zoo_models:two_inputs", cwd=project)
    assert refused.returncode == 3 and "input_inference_failed" in refused.stderr
    assert 'input_shape={"a": (...), "b": (...)}' in refused.stderr
    assert run("summary", "zoo_models:nope", cwd=project).returncode == 4
    assert run("summary", "no_such_module:x", cwd=project).returncode == 4
    bad = run("summary", "zoo_models:mlp", "--input-shape", "2,x", cwd=project)
    assert bad.returncode == 2 and "integers" in bad.stderr
    assert run("show", "missing.tl", cwd=project).returncode == 3
    assert run("frobnicate", cwd=project).returncode == 2


def test_several_and_named_shapes(project):
    out = run("summary", "zoo_models:two_inputs", "--input-shape", "a=1,3",
              "--input-shape", "b=1,3", cwd=project)
    assert out.returncode == 0, out.stderr
    out = run("summary", "zoo_models:two_inputs", "--input-shape", "1,3", "--input-shape", "1,3",
              cwd=project)
    assert out.returncode == 0, out.stderr


def test_console_script_is_declared():
    from importlib.metadata import entry_points

    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts.get("torchlens") == "torchlens.cli:main"
    assert torch.__version__
