"""The html renderer: one self-contained interactive page (script, style and data inline).

The page gets core's whole view model (``torchlens.viz.page.PageModel``) as JSON and only lays
it out (dagre, vendored in ``assets/``, one small layout per expanded module) and toggles it:
expand/collapse, fold/unfold, roll/unroll, search, details, colour by cost. It needs no network
and no server: open the file, or let a notebook show it in an iframe.
"""

from __future__ import annotations

import html
import json
import re
from functools import cache
from importlib import resources

from torchlens.viz import Renderer

CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
       "img-src data: blob:")  # the page may load nothing: no network, no other file
DAGRE = "dagre-3.1.3.min.js"  # @dagrejs/dagre 3.1.3 from npm, MIT (assets/dagre-3.1.3.LICENSE)


@cache
def asset(name: str) -> str:
    """The text of one file in ``torchlens_viz/assets``."""
    return resources.files("torchlens_viz").joinpath("assets", name).read_text(encoding="utf-8")


def inline_json(data: object) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>`` or ``<!--`` can close it)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


class HtmlRenderer(Renderer):
    """Writes one ``.html`` page that lays the drawing out in the browser."""

    name = "html"
    source_format = "html"
    file_formats = ()
    interactive = True

    def build_source(self, view) -> str:  # view: torchlens.viz.page.PageModel
        """The self-contained page: the viewer's script, style and the view model's data inline."""
        parts = {
            "title": html.escape(view.title), "background": view.theme.background,
            "style": asset("viewer.css"), "dagre": asset(DAGRE), "viewer": asset("viewer.js"),
            "data": inline_json(view.data), "csp": CSP,
            "license": "@dagrejs/dagre 3.1.3, MIT licence, Copyright (c) 2012-2014 Chris Pettitt",
        }  # one pass over the template: nothing inserted is scanned again
        return re.sub(r"\{(\w+)\}", lambda m: parts[m.group(1)], PAGE)


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<title>{title} · TorchLens</title>
<style>{style}</style>
</head>
<body style="background:{background}">
<div id="app"></div>
<script id="torchlens-data" type="application/json">{data}</script>
<script>/* {license} */
{dagre}</script>
<script>{viewer}</script>
</body>
</html>
"""
