"""Every public name of the four packages has a docstring, so the API reference the site
generates from them (mkdocstrings) has no empty entry: the names in ``torchlens.__all__`` and
in each public submodule of ``torchlens`` (its ``__all__``, or what it defines), what every
module of the three plugin packages defines (their public surface is their plugin hooks and
the names ``torchlens`` lends from them, such as ``tl.generate``), and the public methods and
properties of every public class."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import torchlens as tl

PACKAGES = ("torchlens", "torchlens_viz", "torchlens_hf", "torchlens_vision")


def _defined(module) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [n for n, v in vars(module).items() if not n.startswith("_") and
            (inspect.isclass(v) or inspect.isfunction(v)) and v.__module__ == module.__name__]


def public_objects() -> dict[str, object]:
    found: dict[str, object] = {}
    modules = [tl] + [importlib.import_module(f"torchlens.{m}") for m in tl.SUBMODULES]
    for package in PACKAGES[1:]:
        root = importlib.import_module(package)
        modules.append(root)
        modules += [importlib.import_module(info.name) for info in pkgutil.walk_packages(
            root.__path__, f"{package}.") if not info.name.rpartition(".")[2].startswith("_")]
    for module in modules:
        found[module.__name__] = module
        for name in _defined(module):
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj)):
                continue  # a constant (a table of dials, a limit): documented where it is used
            found[f"{module.__name__}.{name}"] = obj
            if inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") and attr not in ("__init__", "__call__"):
                        continue
                    if attr in ("__init__", "__call__"):
                        continue  # the class's docstring says how to make and call it
                    if inspect.isfunction(member) or isinstance(member, (property,
                                                                         classmethod,
                                                                         staticmethod)):
                        found[f"{module.__name__}.{name}.{attr}"] = getattr(
                            member, "__func__", member)  # a property keeps its own doc
    return found


def test_every_public_name_has_a_docstring():
    missing = sorted(name for name, obj in public_objects().items()
                     if not (inspect.getdoc(obj) or "").strip() or
                     (not inspect.ismodule(obj) and obj.__doc__ is None))
    assert not missing, f"{len(missing)} public names without a docstring: {missing}"


def test_the_walk_sees_the_surface():
    names = public_objects()
    for name in ("torchlens.trace", "torchlens.Trace.draw", "torchlens.edits.zero",
                 "torchlens.recording.open", "torchlens_hf.generation.generate",
                 "torchlens_viz.plugin.torchlens_renderers", "torchlens_vision"):
        assert name in names
