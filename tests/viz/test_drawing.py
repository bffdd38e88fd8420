"""The detached Drawing: what it owns, save() from source, notebook display, repr."""

from __future__ import annotations

import gc
import inspect
import weakref

import pytest
import torch

import torchlens as tl
from tests.models import CASES
from torchlens.viz import DIALS, Drawing, draw_trace, render_drawing, validate_options
from torchlens.viz.options import DEFAULT_MAX_NODES


def reachable(root, limit: int = 20_000) -> list:
    """Every object reachable from ``root`` (classes and modules excluded)."""
    seen, todo, out = set(), [root], []
    while todo and len(out) < limit:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type) or type(obj).__name__ == "module":
            continue
        seen.add(id(obj))
        out.append(obj)
        todo.extend(gc.get_referents(obj))
    return out


def test_drawing_is_detached_from_model_and_trace(in_tmp):
    model, x = CASES["residual"].build()
    trace = tl.trace(model, x)  # save="all": the trace holds activations
    drawing = trace.draw(file_format="svg", path=in_tmp / "g.svg")
    model_ref, trace_ref = weakref.ref(model), weakref.ref(trace)
    del model, trace, x
    gc.collect()
    assert model_ref() is None and trace_ref() is None
    held = reachable(drawing)
    assert not any(isinstance(obj, (torch.Tensor, torch.nn.Module, tl.Trace, tl.Op))
                   for obj in held)


def test_drawing_owns_source_bytes_path_and_provenance(residual, in_tmp):
    drawing = residual.draw(file_format="svg", path="g.svg")
    assert isinstance(drawing, Drawing) and isinstance(drawing, tl.viz.Drawing)
    assert drawing.source.startswith("digraph") and drawing.renderer == "graphviz"
    assert drawing.file_format == "svg" and b"<svg" in drawing.data
    assert drawing.path == (in_tmp / "g.svg").resolve()
    assert drawing.path.read_bytes() == drawing.data
    assert drawing.provenance == residual.provenance
    assert drawing.provenance is not residual.provenance
    assert drawing.receipt is None


def test_render_drawing_records_the_receipt(residual, in_tmp):
    receipt = {"verified": True, "hash": "abc"}
    drawing = render_drawing(residual, receipt=receipt, collapse="auto", file_format="dot",
                             path="g.dot")
    assert drawing.receipt is receipt
    assert "with receipt" in repr(drawing)
    assert draw_trace(residual, file_format="dot", path="h.dot").receipt is None


def test_save_rerenders_from_source_without_capturing(in_tmp, monkeypatch):
    model, x = CASES["mlp"].build()
    drawing = tl.trace(model, x, save="none").draw(file_format="svg", path="first.svg")
    del model

    def no_capture(*args, **kwargs):
        raise AssertionError("save() must not capture or rebuild the graph")

    monkeypatch.setattr(tl, "trace", no_capture)
    monkeypatch.setattr("torchlens.viz.build.build_view", no_capture)
    png = drawing.save(in_tmp / "again.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pdf = drawing.save(in_tmp / "again.bin", file_format="pdf")
    assert pdf.read_bytes()[:4] == b"%PDF"
    drawing.source = drawing.source.replace("input_1", "edited_input")
    assert b"edited_input" in drawing.save(in_tmp / "edited.svg").read_bytes()


def test_save_editable_writes_the_dot_source(residual, in_tmp):
    drawing = residual.draw(file_format="svg", path="g.svg")
    out = drawing.save(in_tmp / "g.dot", editable=True)
    assert out.read_text(encoding="utf-8") == drawing.source
    same = drawing.save(in_tmp / "g2.dot")  # a .dot suffix is the source too
    assert same.read_text(encoding="utf-8") == drawing.source


def test_notebook_display_hooks(residual, in_tmp):
    drawing = residual.draw(file_format="pdf", path="g.pdf")
    svg = drawing._repr_svg_()
    assert svg is not None and "<svg" in svg
    bundle = drawing._repr_mimebundle_()
    assert bundle["image/svg+xml"] == svg and bundle["text/plain"] == repr(drawing)


def test_repr_is_readable(residual, in_tmp):
    drawing = residual.draw(collapse="auto", file_format="svg", path="g.svg")
    text = repr(drawing)
    assert text.startswith("<Drawing of Residual: graphviz svg, ")
    assert f"{drawing.stats['nodes']} nodes" in text and "g.svg" in text


@pytest.mark.parametrize("theme", ["light", "dark", "print"])
@pytest.mark.parametrize("direction", ["TB", "LR"])
def test_themes_and_directions_reach_the_dot(residual, in_tmp, theme, direction):
    drawing = residual.draw(theme=theme, direction=direction, file_format="dot", path="g.dot")
    assert f"rankdir={direction}" in drawing.source
    expected = tl.viz.THEMES[theme].background
    assert f'bgcolor="{expected}"' in drawing.source


@pytest.mark.parametrize("fmt, magic", [("pdf", b"%PDF"), ("svg", b"<?xml"),
                                        ("png", b"\x89PNG"), ("dot", b"digraph")])
def test_every_file_format(residual, in_tmp, fmt, magic):
    drawing = residual.draw(collapse="auto", file_format=fmt, path=f"g.{fmt}")
    assert drawing.file_format == fmt and drawing.data.startswith(magic)


def test_path_suffix_picks_the_format(residual, in_tmp):
    assert residual.draw(path="g.svg").file_format == "svg"
    assert residual.draw(path="g.png").data.startswith(b"\x89PNG")
    page = residual.draw(path="g.html")
    assert page.renderer == "html" and page.file_format == "html"
    assert (in_tmp / "g.html").read_bytes().startswith(b"<!DOCTYPE html>")


@pytest.mark.parametrize("options", [{"path": "g.unknownext"},
                                     {"path": "g.html", "file_format": "pdf"},
                                     {"path": "g.svg", "file_format": "png"}])
def test_suffix_no_renderer_writes_or_disagreeing_refuses(residual, in_tmp, options):
    with pytest.raises(tl.TorchLensError) as err:
        residual.draw(**options)
    assert err.value.code == "draw_option_invalid"
    assert "graphviz writes dot, pdf, svg, png" in str(err.value)
    assert "html writes html" in str(err.value)
    assert not list(in_tmp.iterdir())


def test_tl_draw_refuses_a_bad_suffix_before_any_forward(in_tmp):
    calls = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            calls.append(1)
            return x * 2

    with pytest.raises(tl.TorchLensError) as err:
        tl.draw(Probe(), torch.ones(2), path="graph.xyz")
    assert err.value.code == "draw_option_invalid" and calls == []
    drawing = tl.draw(Probe(), torch.ones(2), path="graph.html")
    assert drawing.file_format == "html" and calls == [1]
    assert (in_tmp / "graph.html").read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_trace_draw_signature_shows_its_dials():
    params = inspect.signature(tl.Trace.draw).parameters
    assert params["collapse"].default == "none" and params["theme"].default == "light"
    for name in ("module", "depth", "path", "file_format", "open_viewer", "direction",
                 "renderer", "max_nodes"):
        assert name in params
    assert set(DIALS) <= set(params)
    assert params["max_nodes"].default == DEFAULT_MAX_NODES


def test_unknown_keyword_refuses_naming_the_dials(residual):
    with pytest.raises(tl.TorchLensError) as err:
        residual.draw(colapse="auto")
    assert err.value.code == "draw_option_invalid" and isinstance(err.value, TypeError)
    assert err.value.teach[0] == "collapse=..."
    assert "collapse" in err.value.teach[-1] and "file_format" in err.value.teach[-1]
    with pytest.raises(tl.TorchLensError) as err:
        render_drawing(residual, receipt=None, dpi=300)
    assert err.value.code == "draw_option_invalid"


def test_options_validate_without_a_trace():
    """What the tl.draw facade calls before it captures anything."""
    opts = validate_options(collapse="auto", theme="print", direction="lr", file_format=".SVG")
    assert opts.collapse == "auto" and opts.fold is True and opts.theme.name == "print"
    assert opts.direction == "LR" and opts.file_format == "svg"
    with pytest.raises(tl.TorchLensError) as err:
        validate_options(collapse="auto", open_browser=True)
    assert err.value.code == "draw_option_invalid"
    assert "open_viewer" in err.value.teach[-1]


def test_a_nested_tensors_ragged_dimension_is_drawn_as_unknown(tmp_path):
    from tests.core.test_forward_patterns import Jagged

    trace = tl.trace(Jagged(), torch.randn(1, 5, 8))
    trace.draw(file_format="svg", path=tmp_path / "jagged.svg")
    assert "2×?×8" in (tmp_path / "jagged.svg").read_text()
