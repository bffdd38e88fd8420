"""An edited model's drawing says so: the title, and the edited op's box (red border, the edit's
kind and the size of its change), in the static and the interactive renderers."""

from __future__ import annotations

import re

import torch
from torch import nn

import torchlens as tl


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval(), torch.randn(3, 4)


def test_the_svg_marks_the_edited_op_and_only_it(tmp_path):
    model, x = _model()
    tl.draw(model, x, path=tmp_path / "e.svg", collapse="none",
            edits={"relu_1": tl.edits.scale(3.0)})
    svg = (tmp_path / "e.svg").read_text()
    groups = re.findall(r'<g id="node\d+" class="node">(.*?)</g>', svg, flags=re.S)
    edited = [g for g in groups if "EDITED" in g]
    assert len(edited) == 1 and "relu_1" in edited[0] and "#e8710a" in edited[0]
    assert "EDITED scale" in edited[0] and "change" in edited[0]
    assert sum("#e8710a" in g for g in groups) == 1
    tl.draw(model, x, path=tmp_path / "plain.svg", collapse="none")
    assert "EDITED" not in (tmp_path / "plain.svg").read_text()


def test_the_html_viewer_and_a_collapsed_module_carry_the_edit(tmp_path):
    model, x = _model()
    trace = tl.trace(model, x, edits={"1": tl.edits.zero()})
    trace.draw(path=tmp_path / "e.html")
    page = (tmp_path / "e.html").read_text()
    assert "EDITED zero" in page
    assert "EDITED" in trace.draw(path=tmp_path / "e.svg", collapse="modules").source
