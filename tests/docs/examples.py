"""The Python blocks of a Markdown page, run in order in one scope, as a reader would run them.

A block is a fence whose info string starts with ``python`` (attributes after it, such as
markdown-exec's ``exec="on"``, are allowed). A block preceded by ``<!-- not run: REASON -->``
is not run; REASON must say what CI cannot have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<marker><!-- not run: (?P<reason>[^>]*?) -->\n)?```python[^\n]*\n"
                   r"(?P<code>.*?)^```[ \t]*$", re.S | re.M)


@dataclass
class Block:
    page: Path
    line: int
    code: str
    not_run: str | None  # the reason it is not run, or None


def pages() -> list[Path]:
    """The README and every page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [Block(page, text.count("\n", 0, m.start("code")) + 1, m.group("code"),
                  m.group("reason")) for m in FENCE.finditer(text)]


def run_page(page: Path) -> dict:
    """Run every block of ``page`` that is to be run; returns the scope they shared."""
    scope: dict = {"__name__": "__main__"}  # as a script the reader runs
    for block in blocks(page):
        if block.not_run is None:
            # blank lines up front keep tracebacks on the page's own line numbers
            exec(compile("\n" * (block.line - 1) + block.code, str(page), "exec",
                         dont_inherit=True), scope)  # not this module's __future__ imports
    return scope
