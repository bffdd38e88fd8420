"""Where drawings go: collision-safe files in scripts, inline in notebooks, viewer only on ask."""

from __future__ import annotations

import multiprocessing
import sys
import types

import pytest

from torchlens.viz import output


def test_script_call_writes_collision_safe_pdf_and_prints_path(residual, in_tmp, capsys):
    (in_tmp / "Residual-graph.pdf").write_bytes(b"keep me")
    first = residual.draw()
    second = residual.draw()
    assert first.path == in_tmp / "Residual-graph-1.pdf"
    assert second.path == in_tmp / "Residual-graph-2.pdf"
    assert (in_tmp / "Residual-graph.pdf").read_bytes() == b"keep me"  # never overwritten
    assert first.path.read_bytes().startswith(b"%PDF")
    printed = capsys.readouterr().out
    assert str(first.path) in printed and str(second.path) in printed


def test_script_call_with_other_format_uses_that_suffix(residual, in_tmp):
    assert residual.draw(file_format="svg").path == in_tmp / "Residual-graph.svg"


def test_explicit_path_is_written_there(residual, in_tmp):
    target = in_tmp / "sub" / "mine.pdf"
    target.parent.mkdir()
    drawing = residual.draw(path=target)
    assert drawing.path == target and target.read_bytes().startswith(b"%PDF")
    assert sorted(p.name for p in in_tmp.iterdir()) == ["sub"]


def _claim_many(directory: str, barrier, count: int) -> None:
    barrier.wait()
    pid = multiprocessing.current_process().pid
    for i in range(count):
        output.write_new(directory, "Model-graph", "pdf", f"{pid}-{i}".encode())


def test_two_processes_racing_never_share_a_name(tmp_path):
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_claim_many, args=(str(tmp_path), barrier, 15)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    files = sorted(tmp_path.iterdir())
    assert len(files) == 30
    contents = {f.read_bytes() for f in files}
    assert len(contents) == 30  # every write landed in its own file, none overwritten
    assert {f.name for f in files} == {"Model-graph.pdf"} | {f"Model-graph-{i}.pdf"
                                                             for i in range(1, 30)}


def test_notebook_displays_inline_and_writes_nothing(residual, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(output, "in_notebook", lambda: True)
    drawing = residual.draw()
    assert drawing.path is None and list(tmp_path.iterdir()) == []
    assert drawing.file_format == "svg"
    assert drawing._repr_svg_() == drawing.data.decode()
    assert "image/svg+xml" in drawing._repr_mimebundle_()


def test_notebook_detection_needs_a_running_kernel(monkeypatch):
    fake = types.ModuleType("IPython")
    shell = types.SimpleNamespace()
    fake.get_ipython = lambda: shell
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert output.in_notebook() is False  # a terminal IPython has no kernel
    shell.kernel = object()
    assert output.in_notebook() is True
    fake.get_ipython = lambda: None
    assert output.in_notebook() is False
    monkeypatch.delitem(sys.modules, "IPython")
    assert output.in_notebook() is False


@pytest.fixture
def opened(monkeypatch):
    calls = []
    monkeypatch.setattr(output, "open_viewer", calls.append)
    return calls


def test_viewer_never_opens_by_default(residual, in_tmp, opened, monkeypatch):
    residual.draw()
    residual.draw(path="g.svg")
    monkeypatch.setattr(output, "in_notebook", lambda: True)
    residual.draw()
    assert opened == []


def test_viewer_opens_only_when_asked(residual, in_tmp, opened, monkeypatch):
    drawing = residual.draw(path="g.svg", open_viewer=True)
    assert opened == [drawing.path]
    monkeypatch.setattr(output, "in_notebook", lambda: True)
    inline = residual.draw(open_viewer=True)  # a notebook has no file yet: a temp one opens
    assert opened[-1] == inline.path and inline.path.exists()
    assert not (in_tmp / inline.path.name).exists()
    inline.path.unlink()


def test_default_stem_is_safe():
    assert output.default_stem("GPT2LMHeadModel") == "GPT2LMHeadModel-graph"
    assert output.default_stem("a/b c") == "a_b_c-graph"
    assert output.default_stem("") == "model-graph"
