"""Seeing gradients (issue 46): drawings coloured by gradient norm or by any per-op number,
in the static and the interactive renderers, and the summary's gradient-norm column."""

from __future__ import annotations

import re

import pytest
import torch

import torchlens as tl
from torchlens.viz.themes import THEMES


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                               torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()),
                               torch.nn.Linear(8, 2)), torch.randn(3, 4)


def _backwarded():
    model, x = _model()
    trace = tl.trace(model, x, save_grads="all")
    trace.backward(lambda out: out.sum())
    return trace


def _nodes(svg: str) -> dict[str, str]:
    """Node title -> its whole SVG group."""
    groups = re.findall(r'<g id="node\d+" class="node">(.*?)</g>', svg, flags=re.S)
    return {re.search(r"<title>.*?</title>.*?font-weight=\"bold\"[^>]*>([^<]+)<", g,
                      flags=re.S).group(1): g for g in groups}


def test_the_static_drawing_colours_ops_by_gradient_norm(tmp_path):
    trace = _backwarded()
    trace.draw(path=tmp_path / "g.svg", color="grad_norm")
    nodes = _nodes((tmp_path / "g.svg").read_text())
    fill = {t: re.search(r'fill="(#[0-9a-f]{6})"', g).group(1) for t, g in nodes.items()}
    norms = {row["label"]: row["norm"] for row in trace.grads}
    assert "gradient norm" in nodes["linear_1"]
    assert f"gradient norm {norms['tanh_1']:.3g}" in nodes["tanh_1"]
    coloured = {t for t, f in fill.items() if f != THEMES["light"].node_fill}
    assert {"linear_1", "relu_1", "linear_2", "tanh_1", "linear_3"} <= coloured
    assert fill["linear_3"] != fill["linear_1"]  # norms 2.45 and 0.28: the ramp's two ends
    folded = trace.draw(path=tmp_path / "m.svg", color="grad_norm", collapse=1)
    assert "largest gradient norm" in (tmp_path / "m.svg").read_text() and folded


def test_an_overlay_of_your_own_numbers_colours_the_drawing(tmp_path):
    model, x = _model()
    trace = tl.trace(model, x)
    trace.draw(path=tmp_path / "o.svg", overlay={"relu_1": 5.0, "linear_3": -0.5})
    nodes = _nodes((tmp_path / "o.svg").read_text())
    assert "overlay 5" in nodes["relu_1"] and "overlay &#45;0.5" in nodes["linear_3"]
    assert "overlay" not in nodes["tanh_1"]
    trace.draw(path=tmp_path / "f.svg", overlay=lambda op: op.flops)
    assert "overlay 192" in (tmp_path / "f.svg").read_text()  # linear_1's FLOPs
    with pytest.raises(tl.TorchLensError) as err:
        trace.draw(path=tmp_path / "x.svg", overlay={"relu_9": 1.0})
    assert err.value.code == "draw_option_invalid" and "overlay={'relu_1': ...}" in \
        err.value.teach
    with pytest.raises(tl.TorchLensError) as err:
        trace.draw(path=tmp_path / "x.svg", color="grad_norm")  # no backward ran
    assert err.value.code == "grads_unavailable"
    with pytest.raises(tl.TorchLensError) as err:
        trace.draw(path=tmp_path / "x.svg", color="heat")  # no overlay= to name
    assert err.value.code == "draw_option_invalid"
    trace.draw(path=tmp_path / "a.svg", overlay={"relu_1": 2.0}, color="attribution score")
    assert "attribution score 2" in (tmp_path / "a.svg").read_text()


def test_the_viewers_colour_menu_names_an_overlay(tmp_path, open_viewer):
    model, x = _model()
    trace = tl.trace(model, x)
    trace.draw(path=tmp_path / "a.html", overlay=lambda op: op.index, color="attribution score")
    v = open_viewer(tmp_path / "a.html")
    options = v.page.eval_on_selector_all("#color option", "els => els.map(e => e.textContent)")
    assert "attribution score" in options and v.page.locator("#color").input_value() == "metric"
    assert v.page.locator("#legend").inner_text().startswith("attribution score")
    assert v.errors == []


def test_the_viewer_colours_by_gradient_norm_with_a_legend(tmp_path, open_viewer):
    trace = _backwarded()
    trace.draw(path=tmp_path / "g.html", color="grad_norm")
    v = open_viewer(tmp_path / "g.html")
    page = v.page
    assert page.locator("#color").input_value() == "metric"
    assert page.locator("#legend").inner_text().startswith("gradient norm")
    page.click("#expand-all")
    fills = dict(zip(page.eval_on_selector_all(
        "#scene g.node", "els => els.map(e => e.getAttribute('data-title'))"), v.fills()))
    assert len({fills[t] for t in ("linear_1", "tanh_1", "linear_3")}) == 3
    page.locator('#scene g.node[data-title="tanh_1"]').dispatch_event("mouseover")
    norm = next(r["norm"] for r in trace.grads if r["label"] == "tanh_1")
    js = re.sub(r"e([+-])0*(\d)", r"e\1\2", f"{norm:.2e}")  # JS's toExponential(2)
    assert f"gradient norm\t{js}" in page.locator("#details").inner_text()
    page.select_option("#color", "")  # back to the kind colours
    assert page.locator("#legend").inner_text() == ""
    assert v.errors == [] and v.blocked == []


def test_the_summary_adds_a_gradient_norm_column():
    model, x = _model()
    before = [p.grad for p in model.parameters()]
    summary = tl.summary(model, x, grads=lambda out: out[:, 0].sum())
    trace = tl.trace(model, x, save_grads=["0", "2", "3"])
    trace.backward(lambda out: out[:, 0].sum())
    rows = {r["layer"]: r for r in summary.rows}
    for name in ("0", "2", "3"):
        assert rows[name]["grad_norm"] == pytest.approx(float(trace[name].grad.norm()), rel=1e-5)
    text = str(summary)
    assert "Grad norm" in text.splitlines()[3] and "with respect to each call's output" in text
    assert summary.receipt.verified and model.training  # restored as it was
    assert [p.grad for p in model.parameters()] == before
    assert "Grad norm" not in str(tl.summary(model, x))
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(model, x, grads="yes")
    assert err.value.code == "option_invalid"


def test_the_backward_graph_is_drawn_with_its_forward_ops_and_modules(tmp_path, open_viewer):
    model, x = _model()
    trace = tl.trace(model, x, save_grads="all")
    trace.draw(backward=True, path=tmp_path / "b.svg")
    svg = (tmp_path / "b.svg").read_text()
    titles = list(_nodes(svg))
    accumulate = [t for t in titles if t.startswith("AccumulateGrad_")]
    assert len(accumulate) == len(list(model.parameters())) + 1  # and the input's
    for name in ("0.weight", "0.bias", "2.0.weight", "3.bias"):
        assert f"into {name}.grad" in svg
    assert "for tanh_1" in svg and "into input_1" in svg and "Sequential backward" in svg
    assert {"AddmmBackward0_1", "TanhBackward0_1", "ReluBackward0_1"} <= set(titles)
    assert "2.0: Linear" in svg  # each node inside the module call of its forward op
    trace.draw(backward=True, path=tmp_path / "b.html")
    v = open_viewer(tmp_path / "b.html")
    v.page.click("#expand-all")
    assert v.nodes() == len(titles) and v.errors == []
    trace.backward(lambda out: out.sum())  # frees the graph
    with pytest.raises(tl.TorchLensError) as err:
        trace.draw(backward=True, path=tmp_path / "c.svg")
    assert err.value.code == "grads_graph_freed"
    with pytest.raises(tl.TorchLensError) as err:
        tl.trace(model, x).draw(backward=True, path=tmp_path / "c.svg")
    assert err.value.code == "grads_unavailable"


def test_resnet18_backward_graph_has_one_accumulate_per_parameter(tmp_path):
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    trace = tl.trace(model, torch.randn(1, 3, 32, 32), save=None, save_grads="all")
    trace.draw(backward=True, path=tmp_path / "r.svg", collapse="none")
    svg = (tmp_path / "r.svg").read_text()
    assert svg.count(">AccumulateGrad_") == len(list(model.parameters())) + 1
    assert "into layer4.1.conv2.weight.grad" in svg and "for conv2d_20" in svg
