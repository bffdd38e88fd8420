"""The architecture holds: no import cycle in any package (imports inside functions count), one
door into a capture, one site parser, no capability subclassing the recorder, no private name
imported across rooms. The layers themselves are import-linter's contracts (``.importlinter``,
checked by ``lint-imports`` in ``hatch run test:lint``); the last test runs them here too."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import grimp
import pytest
import torch

import torchlens as tl
from torchlens.capture.engine import capture
from torchlens.capture.seam import EVERY_OP, CaptureRequest, Part

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torchlens", "torchlens_viz", "torchlens_hf", "torchlens_vision")
SOURCES = {name: Path(__import__(name).__file__).parent for name in PACKAGES}


def _cycles(graph: grimp.ImportGraph, package: str) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    modules = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in modules:
        if m not in index:
            visit(m)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_in_any_package(package):
    graph = grimp.build_graph(package, cache_dir=None)
    assert _cycles(graph, package) == []


def test_the_cycle_finder_finds_a_cycle_made_by_an_import_inside_a_function(tmp_path,
                                                                           monkeypatch):
    pkg = tmp_path / "loop_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("loop_pkg", cache_dir=None)
    assert _cycles(graph, "loop_pkg") == [["loop_pkg.a", "loop_pkg.b"]]


def test_capture_is_one_door_with_a_request_and_parts():
    assert list(inspect.signature(capture).parameters) == ["request", "parts"]


def test_a_part_sees_the_call_order_the_seam_documents():
    """The worked part of ``capture/seam.py``'s docstring, plus the order of every step."""
    seen: list[str] = []

    class Watch(Part):
        ops = EVERY_OP

        def start(self, session):
            seen.append("start")

        def op(self, out, label, base, *rest):
            if "op" not in seen:
                seen.append("op")
            return out

        def end(self, session):
            seen.append(f"end failed={session.failed}")

        def finish(self, trace, session):
            seen.append("finish")
            trace.meta["ops_seen"] = len(trace)

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    trace = capture(CaptureRequest(model, (torch.rand(2, 3),), {}, save=None), [Watch()])
    assert isinstance(trace, tl.Trace)
    assert seen == ["start", "op", "end failed=False", "finish"]
    assert trace.meta["ops_seen"] == len(trace)


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            yield node


def test_only_sites_py_splits_a_site_on_its_colon():
    """``cli.py`` splits ``pkg.module:factory``, a model target, not a site."""
    found = []
    for package, src in SOURCES.items():
        for path in src.rglob("*.py"):
            if path.name == "sites.py" and package == "torchlens" or path.name == "cli.py":
                continue
            for call in _calls(ast.parse(path.read_text())):
                if call.func.attr in ("split", "rsplit", "partition", "rpartition") and \
                        call.args and isinstance(call.args[0], ast.Constant) and \
                        call.args[0].value == ":":
                    found.append(f"{path.relative_to(src.parent)}:{call.lineno}")
    assert found == []


def test_no_capability_subclasses_the_recorder():
    from torchlens.capture.recorder import Recorder

    subclasses = {cls.__module__ for cls in _all_subclasses(Recorder)}
    assert subclasses <= {"torchlens.capture.recorder"}, subclasses


def _all_subclasses(cls: type) -> set[type]:
    return {sub for child in cls.__subclasses__() for sub in {child, *_all_subclasses(child)}}


def test_no_private_name_is_imported_across_rooms():
    """A room is a subpackage (``torchlens.capture``) or a top-level module."""
    crossing = []
    for package, src in SOURCES.items():
        for path in src.rglob("*.py"):
            rel = path.relative_to(src)
            room = rel.parts[0] if len(rel.parts) > 1 else rel.stem
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.ImportFrom) or node.level == 0 and \
                        (node.module or "").partition(".")[0] not in PACKAGES:
                    continue
                target = _room_of(node, package, rel)
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__") and \
                            target != room:
                        crossing.append(f"{package}/{rel}: {alias.name} from {target}")
    assert crossing == []


def _room_of(node: ast.ImportFrom, package: str, rel: Path) -> str:
    module = node.module or ""
    if node.level == 0:
        parts = module.split(".")
        return module if parts[0] != package else (parts[1] if len(parts) > 1 else "")
    depth = len(rel.parts) - 1  # how deep the importing file sits below the package
    if node.level <= depth:  # within its own subpackage
        return rel.parts[0]
    return module.split(".")[0]


def test_every_exception_class_lives_in_errors_py():
    import importlib
    import pkgutil

    defined = set()
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            defined |= {(obj.__module__, name) for name, obj in vars(module).items()
                        if inspect.isclass(obj) and issubclass(obj, BaseException)
                        and obj.__module__.partition(".")[0] in PACKAGES}
    assert {module for module, _ in defined} == {"torchlens.errors"}, defined


def test_core_imports_with_no_plugin_and_exports_all_it_names():
    code = ("import sys; sys.modules.update(dict.fromkeys(['torchlens_hf', 'torchlens_viz', "
            "'torchlens_vision'])); from torchlens import *; import torchlens; "
            "assert all(hasattr(torchlens, n) for n in torchlens.__all__); print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"TORCHLENS_DISABLE_PLUGINS": "1", "PATH": "/usr/bin:/bin"},
                          timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


def test_the_layer_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    assert "2 kept, 0 broken" in done.stdout
