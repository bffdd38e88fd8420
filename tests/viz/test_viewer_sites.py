"""The html viewer in headless Chromium: its search takes the site vocabulary of save= and
edits= (labels, pass labels, module addresses and calls, globs), and edited boxes stand out."""

from __future__ import annotations

import torch

import torchlens as tl


def _hits(v, query: str) -> str:
    v.page.fill("#search", query)
    v.page.press("#search", "Enter")
    return v.page.locator("#hits").inner_text()


def test_search_takes_sites_globs_and_calls(resnet18_trace, tmp_path, open_viewer):
    path = tmp_path / "r.html"
    resnet18_trace.draw(collapse="none", path=path)
    v = open_viewer(path)
    assert _hits(v, "layer*.0.conv1") == "1 of 4"  # a glob: one part per *
    assert _hits(v, "layer**conv1") == "1 of 8"    # ** crosses the dots
    assert _hits(v, "layer1.0.relu:2") == "1 of 1"  # one call of a module called twice
    assert _hits(v, "layer1.0.relu") == "1 of 2"
    assert _hits(v, "conv2d_3") == "1 of 1"          # an op label, exactly (not conv2d_13)
    current = v.page.locator("#scene g.node.current")
    assert current.get_attribute("data-title") == "conv2d_3"
    assert _hits(v, "layer9.*") == "no match"
    assert _hits(v, "Conv2d").endswith(" of 20")      # not a site: text search as before
    assert v.errors == []


def test_edited_ops_and_calls_stand_out(tmp_path, open_viewer):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()),
                                torch.nn.Linear(8, 2)).eval()
    trace = tl.trace(model, torch.randn(2, 4), edits={"relu_1": tl.edits.scale(2.0),
                                                      "2.1": tl.edits.zero()})
    trace.draw(path=tmp_path / "flat.html", collapse="none")
    v = open_viewer(tmp_path / "flat.html")
    edited = v.page.locator("#scene g.node.edited")
    assert sorted(edited.nth(i).get_attribute("data-title") for i in range(edited.count())) == [
        "relu_1", "tanh_1"]
    relu = v.page.locator('#scene g.node.edited[data-title="relu_1"]')
    assert "EDITED scale" in relu.text_content()
    trace.draw(path=tmp_path / "folded.html", collapse=1)
    v = open_viewer(tmp_path / "folded.html")
    boxes = v.page.locator("#scene g.node.edited")
    assert {boxes.nth(i).get_attribute("data-address") for i in range(boxes.count())} == {
        "1", "2"}
    assert v.errors == []
