"""Static drawings never hang: collapse="auto" keeps its budget on graphs with hundreds of ops
outside any submodule, and a drawing too large for dot refuses before dot starts."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.models.zoo import RootLoop
from torchlens.viz import build_view
from torchlens.viz.cost import layout_cost


class Flat(nn.Module):
    """``n`` root-level ops that never repeat (each step changes the shape)."""

    def __init__(self, n: int = 300):
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.n):
            x = x[..., : x.shape[-1] - 1] * 1.01 if i % 2 else torch.sin(x) + i
        return x


@pytest.fixture(scope="module")
def reservoir() -> tl.Trace:
    return tl.trace(RootLoop(150), torch.randn(2, 150, 4), save="none")


@pytest.fixture(scope="module")
def flat() -> tl.Trace:
    return tl.trace(Flat(300), torch.randn(2, 400), save="none")


def test_auto_folds_a_root_level_loop_into_one_block(reservoir):
    assert len(reservoir.ops) > 700 and not reservoir.modules
    view = build_view(reservoir, collapse="auto")
    assert len(view.nodes) <= 40
    assert [c.title for c in view.clusters] == ["Loop ×150 · 5 ops a step: matmul_1 … tanh_1"]
    assert "sum_1" in view.titles()  # the ops after the loop stay themselves


def test_auto_cuts_a_long_unrepeated_run_into_segments(flat):
    assert len(flat.ops) > 600
    view = build_view(flat, collapse="auto")
    assert 1 < len(view.nodes) <= 40
    assert all(node.kind == "module" and " … " in node.title
               for node in view.nodes if node.kind != "output")
    assert sum(node.ops for node in view.nodes if node.kind == "module") >= len(flat.ops) - 2


@pytest.mark.parametrize("fixture", ["reservoir", "flat"])
def test_auto_svg_of_hundreds_of_root_ops_is_fast(fixture, request, in_tmp):
    trace = request.getfixturevalue(fixture)
    start = time.perf_counter()
    drawing = trace.draw(collapse="auto", path="g.svg")
    assert time.perf_counter() - start < 5
    assert drawing.stats["nodes"] <= 40
    assert (in_tmp / "g.svg").read_bytes().lstrip().startswith(b"<?xml")


def test_too_large_for_dot_refuses_before_layout(reservoir, in_tmp, monkeypatch):
    import torchlens_viz.renderer as gv

    def no_dot(*args, **kwargs):
        raise AssertionError("dot must not start")

    monkeypatch.setattr(gv, "run_dot", no_dot)
    with pytest.raises(tl.TorchLensError) as err:
        reservoir.draw(collapse="none", path="g.svg")  # ~750 nodes, a hub read by every step
    e = err.value
    assert e.code == "drawing_too_large" and isinstance(e, RuntimeError)
    assert f"{len(reservoir.ops):,} ops" in str(e)
    assert any('file_format="html"' in t for t in e.teach)
    assert any("collapse=" in t for t in e.teach)
    assert any("max_nodes=None" in t for t in e.teach)
    assert not list(in_tmp.iterdir())
    # the DOT source needs no layout, and html lays out in the browser: both are fine
    assert reservoir.draw(collapse="none", path="g.dot").file_format == "dot"
    assert reservoir.draw(collapse="none", path="g.html").file_format == "html"


def test_max_nodes_none_accepts_the_wait(in_tmp):
    trace = tl.trace(RootLoop(12), torch.randn(2, 12, 4), save="none")
    with pytest.raises(tl.TorchLensError) as err:
        trace.draw(collapse="none", path="a.svg", max_nodes=20)
    assert err.value.code == "drawing_too_large"
    assert trace.draw(collapse="none", path="b.svg", max_nodes=None).file_format == "svg"


def test_layout_cost_charges_long_edges(reservoir, flat):
    chain = build_view(flat, collapse="none")
    hub = build_view(reservoir, collapse="none")
    assert layout_cost(chain) < 2 * len(chain.nodes)  # a chain: about one per node
    assert layout_cost(hub) > 50 * len(hub.nodes)  # the input read by every step of the loop


def test_max_nodes_is_checked_with_the_other_dials():
    with pytest.raises(tl.TorchLensError) as err:
        tl.draw(nn.Linear(2, 2), torch.ones(1, 2), max_nodes=0)
    assert err.value.code == "draw_option_invalid"


class Heads(nn.Module):
    """Three identical branches read the same input side by side: parallel, not a loop."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = [torch.relu(torch.tanh(x @ self.w) * 2) for _ in range(3)]
        return heads[0] + heads[1] + heads[2]


def test_parallel_copies_and_attention_are_not_taken_for_loops(gpt2_tiny):
    view = build_view(tl.trace(Heads(), torch.randn(2, 8), save="none"), collapse="auto")
    assert not view.clusters and all(node.kind != "module" for node in view.nodes)
    gpt2 = build_view(gpt2_tiny, collapse="auto")  # q/k/v views side by side in attention
    assert not any("Loop" in c.title for c in gpt2.clusters)


def test_a_renderer_that_does_not_write_the_suffix_refuses(residual, in_tmp):
    with pytest.raises(tl.TorchLensError) as err:
        residual.draw(renderer="graphviz", path="g.html")
    assert err.value.code == "draw_option_invalid"
    assert "renderer='graphviz'" in str(err.value) and "html writes html" in str(err.value)
