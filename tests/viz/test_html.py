"""The html renderer: one self-contained page holding core's view model, sized to its budget."""

from __future__ import annotations

import json
import re

import pytest

import torchlens as tl
from torchlens.viz import available_renderers, build_view
from torchlens.viz.options import check_options
from torchlens.viz.page import build_page


def page_data(html_text: str) -> dict:
    raw = re.search(r'<script id="torchlens-data" type="application/json">(.*?)</script>',
                    html_text, re.S).group(1)
    return json.loads(raw)


def test_html_renderer_is_registered_beside_graphviz():
    renderers = available_renderers()
    assert renderers["html"].__module__ == "torchlens_viz.html"
    assert renderers["html"].formats() == ("html",)


def test_one_self_contained_file(gpt2_tiny, in_tmp):
    drawing = gpt2_tiny.draw(file_format="html", collapse="auto")
    assert drawing.renderer == "html" and drawing.path == in_tmp / "GPT2LMHeadModel-graph.html"
    text = drawing.path.read_text(encoding="utf-8")
    assert list(in_tmp.iterdir()) == [drawing.path]  # one file, nothing beside it
    assert "<script src" not in text and "<link" not in text and "@import" not in text
    assert "default-src 'none'" in text  # the page may load nothing at all
    assert "dagre" in text and "Chris Pettitt" in text  # the layout library, with its licence
    assert page_data(text)["title"] == "GPT2LMHeadModel"


def test_the_page_holds_the_same_view_model_as_the_static_drawing(gpt2_tiny):
    opts = check_options(collapse="auto")
    data = build_page(gpt2_tiny, opts).data
    view = build_view(gpt2_tiny, opts)
    (fold,) = data["groups"]
    assert fold["kind"] == "fold" and fold["count"] == 2
    assert fold["cluster"] == view.clusters[[c.count for c in view.clusters].index(2)].title
    assert [data["calls"][m]["address"] for m in fold["members"]] == \
        ["transformer.h.0", "transformer.h.1"]
    expanded = {data["calls"][c]["key"] for c in data["start"]["expanded"]}
    assert "transformer:1" in expanded and data["start"]["unfolded"] == []
    ops = data["ops"]
    assert ops["label"] == [op.label for op in gpt2_tiny.ops]
    i = ops["label"].index("addmm_1")
    assert ops["module"][i] == "transformer.h.0.attn.c_attn:1" and ops["flops"][i] > 0
    assert ops["alias"][ops["label"].index("addmm_5")] == i  # block 1 folds onto block 0


def test_collapse_none_starts_unfolded_and_fully_expanded(residual):
    data = build_page(residual, check_options(collapse="none")).data
    assert len(data["start"]["expanded"]) == len(data["calls"])
    assert data["start"]["unfolded"] == list(range(len(data["groups"])))


def test_file_size_budget(gpt2_12, in_tmp):
    drawing = gpt2_12.draw(collapse="auto", path="g.html")
    size = len(drawing.data)
    assert size <= 2_000_000 + 300 * len(gpt2_12.ops)
    assert len(page_data(drawing.data.decode())["ops"]["label"]) == len(gpt2_12.ops)


def test_save_and_notebook_display(residual, in_tmp, monkeypatch):
    drawing = residual.draw(path="a.html")
    again = drawing.save(in_tmp / "b.html")
    assert again.read_bytes() == (in_tmp / "a.html").read_bytes()
    bundle = drawing._repr_mimebundle_()
    assert bundle["text/html"].startswith("<iframe srcdoc=")
    assert "&lt;!DOCTYPE html&gt;" in bundle["text/html"] and "image/svg+xml" not in bundle
    svg_drawing = residual.draw(path="c.svg")
    with pytest.raises(tl.TorchLensError) as err:
        svg_drawing.save(in_tmp / "c.html")  # a DOT drawing keeps no trace to re-draw from
    assert err.value.code == "draw_option_invalid"
    assert any('trace.draw(path="c.html")' in t for t in err.value.teach)


def test_notebook_html_drawing_writes_nothing(residual, tmp_path, monkeypatch):
    from torchlens.viz import output

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(output, "in_notebook", lambda: True)
    drawing = residual.draw(renderer="html")
    assert drawing.file_format == "html" and drawing.path is None
    assert not list(tmp_path.iterdir())
    assert drawing._repr_html_().startswith("<iframe")


def test_declared_input_carries_the_provenance_banner(in_tmp):
    from torch import nn

    drawing = tl.draw(nn.Sequential(nn.Linear(4, 3), nn.ReLU()), input_shape=(2, 4),
                      path="p.html")
    banner = page_data(drawing.data.decode())["banner"]
    assert banner.startswith("Input: declared") and "2×4" in banner
