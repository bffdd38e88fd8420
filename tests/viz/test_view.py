"""The graph view: collapse modes, module scope, depth, folds, rolls and labels (no dot needed)."""

from __future__ import annotations

import time

import pytest
import torch

import torchlens as tl
from torchlens.viz import build_view

from .conftest import stack_trace


def cluster_titles(view) -> list[str]:
    return [c.title for c in view.clusters]


def test_none_draws_every_op_with_shape_params_and_edge_shapes(residual):
    view = build_view(residual)
    assert set(view.titles()) == {op.label for op in residual.ops}
    conv = next(n for n in view.nodes if n.title == "conv2d_1")
    assert conv.shape == "1×8×8×8" and conv.params == 224
    assert "224 params" in conv.lines[-1] and "stem · Conv2d" in conv.lines
    labels = {(view.node(e.tail).title, view.node(e.head).title): e.label for e in view.edges}
    assert labels[("input_1", "conv2d_1")] == "1×3×8×8"
    assert labels[("mean_1", "linear_1")] == "1×8"
    assert len(view.edges) == sum(len(op.parents) for op in residual.ops)


def test_none_labels_module_calls_as_nested_clusters(residual):
    view = build_view(residual)
    by_title = {c.title: c for c in view.clusters}
    assert set(by_title) == {"blocks: Sequential", "blocks.0: BasicBlock", "blocks.1: BasicBlock"}
    assert by_title["blocks.0: BasicBlock"].parent == by_title["blocks: Sequential"].id
    add = next(n for n in view.nodes if n.title == "add_1")
    assert add.cluster == by_title["blocks.0: BasicBlock"].id


def test_modules_makes_each_innermost_call_one_node(gpt2_tiny):
    view = build_view(gpt2_tiny, collapse="modules")
    nodes = {n.title: n for n in view.nodes}
    c_attn = nodes["c_attn"]  # inside the "attn" cluster, so named relative to it
    assert c_attn.kind == "module" and c_attn.lines[0] == "Conv1D" and c_attn.ops == 3
    assert "addmm_1" not in nodes and "split_1" in nodes  # ops of non-leaf calls stay ops
    assert "transformer.h.0.attn: GPT2Attention" in cluster_titles(view) or any(
        t.startswith("attn: GPT2Attention") for t in cluster_titles(view))


def test_int_collapses_at_that_module_depth(residual, gpt2_tiny):
    view = build_view(residual, collapse=1)
    assert view.titles() == ["input_1", "stem", "blocks", "mean_1", "fc", "output_1"]
    assert view.clusters == []
    blocks = view.nodes[2]
    assert blocks.kind == "module" and blocks.lines[0] == "Sequential"
    assert blocks.params == residual.modules["blocks"].num_params
    view2 = build_view(gpt2_tiny, collapse=3)
    assert {"h.0", "h.1"} <= set(view2.titles())


def test_depth_caps_cluster_nesting(residual, gpt2_tiny):
    assert cluster_titles(build_view(residual, depth=1)) == ["blocks: Sequential"]
    assert build_view(residual, depth=0).clusters == []
    assert max(c.depth for c in build_view(gpt2_tiny, depth=2).clusters) == 2
    assert max(c.depth for c in build_view(gpt2_tiny).clusters) > 2


def test_module_scope_draws_only_that_subgraph(residual):
    view = build_view(residual, module="blocks.0")
    inside = {op.label for op in residual.ops if "blocks.0:1" in (op.module_stack or ())}
    op_titles = {n.title for n in view.nodes if n.kind != "boundary"}
    assert op_titles == inside
    boundary = {n.title: n for n in view.nodes if n.kind == "boundary"}
    assert set(boundary) == {"conv2d_1", "conv2d_4", "add_2"}  # stem in; blocks.1 reads it
    assert boundary["conv2d_1"].lines[0] == "from stem"
    assert view.title == "Residual · blocks.0"
    assert build_view(residual, module="blocks.0", collapse=1).titles()[:2] == ["conv1", "bn1"]


def test_unknown_module_refuses_with_close_names(residual):
    with pytest.raises(tl.TorchLensError) as err:
        build_view(residual, module="block")
    assert err.value.code == "key_not_found"
    assert any("blocks" in t for t in err.value.teach)


def test_auto_folds_gpt2_blocks_into_one(gpt2_tiny):
    view = build_view(gpt2_tiny, collapse="auto")
    folds = [c for c in view.clusters if c.count == 2]
    assert [c.title for c in folds] == ["GPT2Block ×2 · h.0–1"]
    assert len(view.nodes) <= 40
    assert not any(".h.1" in t or "h.1" == t for t in view.titles())
    small = build_view(gpt2_tiny, collapse="auto", node_budget=22)
    node = next(n for n in small.nodes if n.title == "GPT2Block ×2")
    assert node.kind == "module" and node.count == 2
    assert node.params == 2 * gpt2_tiny.modules["transformer.h.0"].num_params


@pytest.mark.parametrize("n", [2, 5])
def test_auto_folds_n_identical_consecutive_siblings(n):
    trace = stack_trace(n)
    view = build_view(trace, collapse="auto", node_budget=8)
    titles = view.titles()
    assert f"Block ×{n}" in titles
    assert "last" in titles  # the different block stays itself
    node = next(x for x in view.nodes if x.title == f"Block ×{n}")
    assert node.lines[0] == f"blocks.0–{n - 1}"
    into = [view.node(e.tail) for e in view.edges if e.head == node.id]
    out = [view.node(e.head) for e in view.edges if e.tail == node.id]
    # single-op calls draw as their op, named by the module: linear_1 / "embed · Linear"
    assert [x.lines[0] for x in into] == ["embed · Linear"]
    assert [x.lines[0] for x in out] == ["proj · Linear"]


def test_fold_keeps_input_to_output_path_connected():
    view = build_view(stack_trace(4), collapse="none", fold=True)
    ids = {n.id: n for n in view.nodes}
    succ: dict[str, list[str]] = {}
    for e in view.edges:
        succ.setdefault(e.tail, []).append(e.head)
    start = next(n.id for n in view.nodes if n.kind == "input")
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(succ.get(node, ()))
    assert any(ids[n].kind == "output" for n in seen)
    assert len(view.nodes) < len(build_view(stack_trace(4)).nodes)


def test_different_sibling_modules_do_not_fold(recurrent):
    view = build_view(recurrent, collapse="auto")
    assert all(n.count == 1 for n in view.nodes)  # inp and cell are both Linear, not repeats


def test_roll_recurrent_rolls_passes_into_counted_nodes(recurrent):
    plain = build_view(recurrent)
    assert {"linear_2", "linear_2:2", "linear_2:3"} <= set(plain.titles())
    view = build_view(recurrent, roll_recurrent=True)
    assert view.titles() == ["input_1", "linear_1", "linear_2 ×3", "tanh_1 ×3", "linear_3",
                             "output_1"]
    edges = {(view.node(e.tail).title, view.node(e.head).title) for e in view.edges}
    assert ("linear_2 ×3", "tanh_1 ×3") in edges and ("tanh_1 ×3", "linear_2 ×3") in edges
    collapsed = build_view(recurrent, collapse=1, roll_recurrent=True)
    assert "cell ×3" in collapsed.titles()


def test_theme_and_direction_reach_the_view(residual):
    view = build_view(residual, theme="dark", direction="lr")
    assert view.theme.name == "dark" and view.direction == "LR"


@pytest.mark.parametrize("options, teach_part", [
    ({"theme": "neon"}, 'theme="dark"'),
    ({"collapse": "everything"}, 'collapse="auto"'),
    ({"collapse": 0}, "collapse=1"),
    ({"direction": "up"}, 'direction="LR"'),
    ({"depth": -1}, "depth=1"),
    ({"node_budget": 0}, "node_budget=1"),
])
def test_bad_dial_values_refuse_typed(residual, options, teach_part):
    with pytest.raises(tl.TorchLensError) as err:
        build_view(residual, **options)
    assert err.value.code == "draw_option_invalid"
    assert isinstance(err.value, ValueError)
    assert teach_part in "\n".join(err.value.teach)


def test_gpt2_twelve_layers_view_is_fast_and_folded(gpt2_12):
    assert len(gpt2_12.ops) > 400
    start = time.perf_counter()
    view = build_view(gpt2_12, collapse="auto")
    assert time.perf_counter() - start < 0.5
    assert view.meta["folded"] == ["GPT2Block ×12 · transformer.h.0–11"]
    assert any(c.title == "GPT2Block ×12 · h.0–11" for c in view.clusters)
    assert len(view.nodes) <= 40


class TwoDevices(torch.nn.Module):
    """A model split over two devices (cpu, then meta: the second device any machine has)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        with torch.device("meta"):
            self.b = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.b(self.a(x).to("meta"))


def test_edges_that_cross_devices_are_named_in_the_trace_and_the_drawing():
    trace = tl.trace(TwoDevices(), torch.rand(3, 4), save=None)
    assert trace.device_crossings == [("linear_1", "to_1", "cpu", "meta")]
    view = build_view(trace)
    labels = {(view.node(e.tail).title, view.node(e.head).title): e.label for e in view.edges}
    assert labels[("linear_1", "to_1")] == "3×4 cpu→meta"
    assert labels[("input_1", "linear_1")] == "3×4"  # same device: the shape alone
