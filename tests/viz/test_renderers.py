"""Renderer plugins: graphviz through the hook, the Mermaid example, refusals, clashes."""

from __future__ import annotations

import time
from importlib import metadata

import pytest

import torchlens as tl
from torchlens.plugins import get_plugin_manager
from torchlens.viz import Renderer, available_renderers


def test_entry_points_load_the_graphviz_and_mermaid_renderers():
    eps = {ep.name: ep for ep in metadata.entry_points(group="torchlens")}
    assert {"viz", "mermaid"} <= set(eps)
    assert hasattr(eps["mermaid"].load(), "torchlens_renderers")
    renderers = available_renderers()
    assert renderers["graphviz"].__module__ == "torchlens_viz.renderer"
    assert renderers["mermaid"].__module__ == "torchlens_mermaid.renderer"
    assert all(issubclass(cls, Renderer) for cls in renderers.values())


def test_mermaid_chosen_by_name(residual, in_tmp):
    drawing = residual.draw(renderer="mermaid", collapse="auto")
    assert drawing.renderer == "mermaid" and drawing.file_format == "mmd"
    assert drawing.path == in_tmp / "Residual-graph.mmd"
    assert "flowchart TB" in drawing.source and 'subgraph c' in drawing.source
    assert "BasicBlock ×2" in drawing.path.read_text(encoding="utf-8")


def test_mermaid_chosen_by_file_format_and_suffix(residual, in_tmp):
    by_format = residual.draw(file_format="mmd", direction="LR", theme="dark", path="a.mmd")
    assert by_format.renderer == "mermaid" and "flowchart LR" in by_format.source
    assert '"theme": "dark"' in by_format.source
    by_suffix = residual.draw(path="b.mmd")
    assert by_suffix.renderer == "mermaid" and by_suffix.data == by_suffix.source.encode()
    assert by_suffix.save(in_tmp / "c.mmd").read_text(encoding="utf-8") == by_suffix.source


def test_format_no_renderer_writes_refuses(residual):
    with pytest.raises(tl.TorchLensError) as err:
        residual.draw(file_format="bmpx")
    assert err.value.code == "draw_option_invalid"
    assert 'file_format="svg"' in err.value.teach and 'file_format="mmd"' in err.value.teach
    with pytest.raises(tl.TorchLensError) as err:
        residual.draw(renderer="mermaid", file_format="pdf")
    assert err.value.code == "draw_option_invalid" and err.value.teach == ['file_format="mmd"']


def test_unknown_renderer_name_refuses(residual):
    with pytest.raises(tl.TorchLensError) as err:
        residual.draw(renderer="matplotlib")
    assert err.value.code == "renderer_unavailable"
    assert 'renderer="graphviz"' in err.value.teach


def test_no_renderer_installed_refuses_with_install_teach(residual, in_tmp):
    pm = get_plugin_manager()
    providers = [(pm.get_name(impl.plugin), impl.plugin)
                 for impl in pm.hook.torchlens_renderers.get_hookimpls()]
    assert providers
    for _, plugin in providers:
        pm.unregister(plugin)
    try:
        with pytest.raises(tl.TorchLensError) as err:
            residual.draw()
        assert err.value.code == "renderer_unavailable"
        assert err.value.teach == ["pip install torchlens-viz"]
        assert list(in_tmp.iterdir()) == []
    finally:
        for name, plugin in providers:
            pm.register(plugin, name=name)
    assert "graphviz" in available_renderers()


GRAPHVIZ_TEACH = ("apt-get install -y graphviz", "brew install graphviz",
                  "conda install -c conda-forge graphviz", "editable=True")


def test_missing_dot_refuses_with_install_commands(residual, in_tmp, monkeypatch):
    drawing = residual.draw(file_format="svg", path="ok.svg")
    monkeypatch.setenv("PATH", str(in_tmp))  # no dot on PATH
    with pytest.raises(tl.TorchLensError) as err:
        residual.draw(file_format="svg", path="g.svg")
    assert err.value.code == "graphviz_not_found"
    for part in GRAPHVIZ_TEACH:
        assert any(part in line for line in err.value.teach), part
    source_only = err.value.drawing  # the refusal carries the drawing, source only
    assert source_only.data is None and source_only.file_format == "dot"
    assert source_only.save(in_tmp / "rescued.dot", editable=True).read_text().startswith("digraph")
    assert not (in_tmp / "g.svg").exists()
    with pytest.raises(tl.TorchLensError) as err:
        drawing.save(in_tmp / "again.png")
    assert err.value.code == "graphviz_not_found"
    # what the teach promises works without dot
    assert drawing.save(in_tmp / "g.dot", editable=True).read_text() == drawing.source
    assert residual.draw(file_format="dot", path="g2.dot").data.startswith(b"digraph")


class _Dupe(Renderer):
    source_format = "dot"

    def build_source(self, view):
        return ""


class _DupePlugin:
    @tl.hookimpl
    def torchlens_renderers(self):
        return {"graphviz": _Dupe}


class _BadPlugin:
    @tl.hookimpl
    def torchlens_renderers(self):
        return ["not", "a", "mapping"]


@pytest.mark.parametrize("plugin, parts", [
    (_DupePlugin(), ("torchlens_viz.renderer.GraphvizRenderer", "test_renderers._Dupe",
                     "graphviz")),
    (_BadPlugin(), ("mapping",)),
])
def test_broken_renderer_plugins_refuse_plugin_invalid(residual, plugin, parts):
    pm = get_plugin_manager()
    pm.register(plugin, name="test-renderer-plugin")
    try:
        with pytest.raises(tl.TorchLensError) as err:
            residual.draw(file_format="dot")
        assert err.value.code == "plugin_invalid"
        for part in parts:
            assert part in err.value.message
    finally:
        pm.unregister(plugin)


def test_gpt2_twelve_layers_auto_svg_is_well_under_a_second(gpt2_12, in_tmp):
    gpt2_12.draw(collapse="auto", file_format="svg", path="warm.svg")  # imports, dot start
    start = time.perf_counter()
    drawing = gpt2_12.draw(collapse="auto", file_format="svg", path="g.svg")
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, elapsed
    assert b"GPT2Block \xc3\x9712" in drawing.data  # "×12"
