"""The html viewer in diff mode (``cmp.draw(path="diff.html")``), in headless Chromium: ops
coloured by their difference, added ops marked, a module showing its largest difference, both
sides in the details panel, and the first divergence one click away (issue 48)."""

from __future__ import annotations

import torch
import torchvision

import torchlens as tl
from torchlens.viz.themes import THEMES


def _edited_pair():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()),
                                torch.nn.Linear(8, 2)).eval()
    x = torch.randn(2, 4)
    return tl.compare(tl.trace(model, x), tl.trace(model, x,
                                                   edits={"relu_1": tl.edits.scale(2.0)}))


def test_diff_mode_colours_by_difference_and_jumps_to_the_first_divergence(tmp_path,
                                                                           open_viewer):
    cmp = _edited_pair()
    cmp.draw(path=tmp_path / "diff.html")
    v = open_viewer(tmp_path / "diff.html")
    page = v.page
    assert page.locator("#color").input_value() == "metric"  # diff mode opens coloured by it
    assert "first divergence relu_1 in 1" in page.locator("#banner").inner_text()
    page.click("#expand-all")
    fills = dict(zip(page.eval_on_selector_all(
        "#scene g.node", "els => els.map(e => e.getAttribute('data-title'))"), v.fills()))
    plain = THEMES["light"].node_fill
    assert fills["linear_1"] == plain  # equal: the theme's fill
    downstream = ("relu_1", "linear_2", "tanh_1", "linear_3")
    assert all(fills[t] != plain for t in downstream)
    assert len({fills[t] for t in downstream}) > 1  # the ramp tells them apart
    page.click("#legend a[data-op]")  # the legend's first-divergence link
    details = page.locator("#details").inner_text()
    assert details.startswith("relu_1") and "relative diff\t1" in details
    assert "outside tol.\t" in details and "a\trelu_1 · 2×8 float32" in details
    assert page.locator("#scene g.node.selected").get_attribute("data-title") == "relu_1"
    page.select_option("#color", "time_ns")  # the other colourings still work
    assert page.locator("#legend").inner_text().startswith("time")
    assert v.errors == [] and v.blocked == []


def test_added_ops_are_marked_and_modules_show_their_largest_difference(tmp_path, open_viewer):
    torch.manual_seed(0)
    r18 = torchvision.models.resnet18(weights=None).eval()
    r34 = torchvision.models.resnet34(weights=None).eval()
    cmp = tl.compare(r18, r34, torch.randn(1, 3, 64, 64))
    cmp.draw(path=tmp_path / "arch.html", collapse=1)
    v = open_viewer(tmp_path / "arch.html")
    page = v.page
    layer3 = page.locator('#scene g.node[data-address="layer3"]')
    assert "28 added" in layer3.text_content() and "largest Δ rel" in layer3.text_content()
    page.click("#expand-all")
    added = page.locator("#scene g.node.d-added")
    assert added.count() == sum(r.status == "added" for r in cmp.rows) == 56
    box = added.first
    assert box.locator("rect").evaluate("e => getComputedStyle(e).strokeDasharray") != "none"
    box.dispatch_event("mouseover")
    assert "model_a\t— (absent)" in page.locator("#details").inner_text()
    assert v.errors == [] and v.blocked == []


def _deep_pair(blocks: int = 24, at: int = 20):
    """A long chain of blocks, edited near its end: the first divergence lies far down."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
                                  for _ in range(blocks)]).eval()
    x = torch.randn(2, 8)
    return tl.compare(tl.trace(model, x), tl.trace(model, x,
                                                   edits={f"{at}.1": tl.edits.scale(2.0)}))


def _on_screen(page, selector: str) -> bool:
    box, view = page.locator(selector).bounding_box(), page.locator("#graph").bounding_box()
    return (box is not None and box["x"] >= view["x"] and box["y"] >= view["y"]
            and box["x"] + box["width"] <= view["x"] + view["width"]
            and box["y"] + box["height"] <= view["y"] + view["height"])


def test_the_diff_page_opens_scrolled_to_the_first_divergence(tmp_path, open_viewer):
    cmp = _deep_pair()
    first = cmp.first_divergence().label
    cmp.draw(path=tmp_path / "deep.html")
    v = open_viewer(tmp_path / "deep.html")
    page = v.page
    node = f'#scene g.node[data-title="{first}"]'
    assert _on_screen(page, node)
    assert page.locator("#scene g.node.selected").get_attribute("data-title") == first
    assert page.locator("#details").inner_text().startswith(first)
    # the top of the graph is what scrolled away: the page did move to get there
    assert not _on_screen(page, '#scene g.node[data-title="input_1"]')
    page.click("#fit")
    assert _on_screen(page, '#scene g.node[data-title="input_1"]')
    # hovering still shows other ops: the divergence is selected, not pinned
    page.locator('#scene g.node[data-title="input_1"]').dispatch_event("mouseover")
    assert page.locator("#details").inner_text().startswith("input_1")
    assert v.errors == [] and v.blocked == []


def test_the_depth_box_says_what_is_drawn_expanded(tmp_path, open_viewer):
    cmp = _deep_pair(blocks=4, at=2)
    cmp.draw(path=tmp_path / "all.html")  # collapse="none": every block open
    v = open_viewer(tmp_path / "all.html")
    page = v.page
    assert page.locator("#depth").input_value() == "2"  # the blocks (depth 1) are open
    shown = v.nodes()
    page.click("#expand-depth")
    assert v.nodes() == shown  # expanding to the depth it shows changes nothing
    page.click("#collapse-all")
    assert page.locator("#depth").input_value() == "1" and v.nodes() < shown
    page.click("#expand-all")
    assert page.locator("#depth").input_value() == "2" and v.nodes() == shown
    cmp.draw(path=tmp_path / "one.html", collapse=1)  # the blocks as boxes
    one = open_viewer(tmp_path / "one.html")
    assert one.page.locator("#depth").input_value() == "1"
    boxes = one.nodes()
    one.page.click("#expand-depth")
    assert one.nodes() == boxes
    assert v.errors == [] and one.errors == [] and v.blocked == one.blocked == []
