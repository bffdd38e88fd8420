"""Every error and warning code: its meaning (``errors.CODES``) and the teaches its raise sites
give, read from the source of TorchLens and its installed plugins, so a listing made from it
(the documentation's error page) names every code and says what the code itself says."""

from __future__ import annotations

import ast
import importlib.util
from importlib import metadata
from pathlib import Path
from typing import Any

from .errors import CODES


def installed_packages() -> tuple[str, ...]:
    """``torchlens`` and the top-level package of every installed plugin (the entry points of
    group ``torchlens``), whose raise sites the catalogue reads too."""
    plugins = {ep.module.partition(".")[0] for ep in metadata.entry_points(group="torchlens")}
    return ("torchlens", *sorted(plugins - {"torchlens"}))


def _text(node: ast.AST) -> str | None:
    """A teach as written: a string, or an f-string with ``…`` for each value it formats; a
    call's teach made by ``errors.surface_call`` (the user's call, ``…`` the surface and values
    known only then) or by a step run's ``call.text``; two of them joined by ``+``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return left + right if left is not None and right is not None else None
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "surface_call" and \
            node.args:
        from .errors import surface_call

        surface = _text(node.args[0]) or "…"
        options = _text(node.args[1]) or "…" if len(node.args) > 1 else ""
        return surface_call(surface, options)
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "text" and \
            isinstance(node.func.value, (ast.Name, ast.Attribute)) and \
            "call" in ast.unparse(node.func.value):  # a step run's StepsCall.text
        options = ", ".join(f"{k.arg}=…" for k in node.keywords if k.arg)
        comment = _text(node.args[0]) if node.args else None
        return f"tl.…(…{', ' + options if options else ''})" + (
            f"  # {comment}" if comment else "")
    return None


def _items(node: ast.AST) -> list[ast.AST]:
    """The teaches a ``teach=`` expression lists: a list or tuple's items, each side of a
    ``+``, a comprehension's item, a starred list's items."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return [i for elt in node.elts for i in _items(elt)] \
            if any(isinstance(e, ast.Starred) for e in node.elts) else list(node.elts)
    if isinstance(node, ast.Starred):
        return _items(node.value)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and \
            _text(node) is None:
        return _items(node.left) + _items(node.right)
    if isinstance(node, ast.ListComp):
        return [node.elt]
    return [node]


def _texts(node: ast.AST) -> list[str]:
    """Every string ``node`` can be: both branches of ``a if cond else b``."""
    if isinstance(node, ast.IfExp):
        return _texts(node.body) + _texts(node.orelse)
    text = _text(node)
    return [text] if text else []


def _sites(tree: ast.AST) -> list[tuple[str, list[str]]]:
    """(code, teaches) of each place naming a code: a call's ``code="..."`` keyword or
    ``warn("...")``, a class's ``code = "..."``, a record's ``{"code": "..."}``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == \
                ["code"] and _text(node.value):
            found.append((node.value.value, []))
        elif isinstance(node, ast.Dict):
            found += [(v.value, []) for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and k.value == "code" and
                      isinstance(v, ast.Constant) and isinstance(v.value, str)]
        if not isinstance(node, ast.Call):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        codes = _texts(kw["code"]) if "code" in kw else []
        if not codes and node.args and _text(node.args[0]) in CODES:
            codes = [_text(node.args[0])]  # warn("code", ...) and helpers taking the code first
        if not codes:
            continue
        teach = kw.get("teach")
        if teach is None:  # a helper's teach passed by position: its list of strings
            teach = next((a for a in node.args if isinstance(a, (ast.List, ast.Tuple)) and
                          a.elts and all(_text(e) for e in a.elts)), None)
        items = _items(teach) if teach is not None else []
        found += [(code, [t for item in items for t in _texts(item)]) for code in codes]
    return found


def catalogue(packages: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """One row per code of ``errors.CODES``, in its order: ``code``, ``meaning``, ``teach``
    (the distinct teaches of its raise sites, as written) and ``raised_in`` (modules), read
    from ``packages`` (default: ``installed_packages()``)."""
    teaches: dict[str, list[str]] = {}
    where: dict[str, list[str]] = {}
    for package in packages if packages is not None else installed_packages():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(root.rglob("*.py")):
            module = ".".join((package, *path.relative_to(root).with_suffix("").parts))
            for code, items in _sites(ast.parse(path.read_text(encoding="utf-8"))):
                for item in items:
                    if item not in teaches.setdefault(code, []):
                        teaches[code].append(item)
                if module.removesuffix(".__init__") not in where.setdefault(code, []):
                    where[code].append(module.removesuffix(".__init__"))
    return [{"code": code, "meaning": meaning, "teach": teaches.get(code, []),
             "raised_in": where.get(code, [])} for code, meaning in CODES.items()]


def markdown(rows: list[dict[str, Any]] | None = None, teaches: int = 3) -> str:
    """The catalogue as a Markdown table (at most ``teaches`` teaches a code)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    def code(text: str) -> str:
        return f"``{cell(text)}``" if "`" in text else f"`{cell(text)}`"

    lines = ["| code | what causes it | what to do next | raised in |", "|---|---|---|---|"]
    for row in rows if rows is not None else catalogue():
        shown = "<br>".join(code(t) for t in row["teach"][:teaches]) or "—"
        where = ", ".join(f"`{m}`" for m in row["raised_in"]) or "—"
        lines.append(f"| `{row['code']}` | {cell(row['meaning'])} | {shown} | {where} |")
    return "\n".join(lines)
