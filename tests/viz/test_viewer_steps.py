"""run.draw(path="gen.html") (issue 47): the viewer with a step selector, in headless Chromium:
each distinct graph once, the first step drawn apart when its graph differs, each step's own
times and shapes."""

from __future__ import annotations

import torch
from torch import nn

import torchlens as tl


class Decoder(nn.Module):
    """A first call that starts the cache (a graph of its own), later calls that grow it."""

    def __init__(self):
        super().__init__()
        self.start, self.step = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x, cache=None):
        if cache is None:
            cache = self.start(x)
        else:
            cache = torch.cat([cache, self.step(x)], dim=0)
        return torch.tanh(cache[-1:]), cache


def _run():
    torch.manual_seed(0)
    model, x, cache = Decoder(), torch.randn(1, 4), None
    with tl.steps(model, save="all") as run:
        for _ in range(5):
            x, cache = model(x, cache)
    return run


def test_the_step_selector_switches_steps_and_graphs(tmp_path, open_viewer):
    run = _run()
    assert run.structures == 2 and [run.shared(i) for i in range(5)] == [0, 1, 1, 1, 1]
    run.draw(path=tmp_path / "gen.html", collapse="none")
    v = open_viewer(tmp_path / "gen.html")
    page = v.page
    options = page.eval_on_selector_all("#step option", "els => els.map(e => e.textContent)")
    assert len(options) == 5 and options[0].startswith("0 (prefill)")
    first = {t for t in page.eval_on_selector_all(
        "#scene g.node", "els => els.map(e => e.getAttribute('data-title'))")}
    assert "linear_1" in first and "cat_1" not in first  # the prefill's own graph
    with page.expect_navigation():
        page.select_option("#step", "2")  # another graph: the page reopens on it
    page.wait_for_selector("body[data-ready='1']")
    assert page.url.endswith("#step=2") and page.evaluate("window.torchlens.state.step") == 2
    cat = page.locator('#scene g.node[data-title="cat_1"]')
    assert "3×4" in cat.text_content()  # step 2's cache: three rows
    page.select_option("#step", "4")  # the same graph: repainted in place
    assert page.evaluate("window.torchlens.state.step") == 4 and page.url.endswith("#step=4")
    assert "5×4" in cat.text_content()
    times = page.evaluate("window.torchlens.data.ops.time_ns")
    assert times == [op.time_ns for op in run[4].ops]
    assert v.errors == [] and v.blocked == []


def test_a_static_format_draws_one_step(tmp_path):
    run = _run()
    run.draw(path=tmp_path / "s3.svg", step=3, collapse="none")
    assert "4×4" in (tmp_path / "s3.svg").read_text()
    run.draw(path=tmp_path / "s0.svg", collapse="none")  # the first captured step by default
    assert "cat_1" not in (tmp_path / "s0.svg").read_text()
