"""The documentation build's own steps (an mkdocs hook module).

- Every plain ```` ```python ```` block of a page runs (markdown-exec, one session a page, in
  order), and what it prints is shown under it; a block marked ``<!-- not run: why -->`` is
  only shown. The tests run the same blocks (``tests/docs``).
- They run in a scratch folder, so what they write (drawings, stores, pages) stays out of the
  repository; each self-contained ``.html`` page they write is published under ``live/``,
  where the guides embed it in an iframe.
- The gallery's drawings and viewer screenshots are drawn anew by ``docs/gallery``'s scripts
  and published under ``generated/``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
GALLERY = ROOT / "docs" / "gallery"
_state: dict = {}
PLAIN = re.compile(r"^(<!-- not run: [^>]*-->\n)?```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def on_config(config):
    # included files (``--8<--``) are named from the repository root, wherever the build runs
    config["mdx_configs"].setdefault("pymdownx.snippets", {})["base_path"] = [str(ROOT)]
    scratch = Path(tempfile.mkdtemp(prefix="torchlens-docs-"))
    _state.update(scratch=scratch, cwd=os.getcwd())
    os.chdir(scratch)
    return config


def on_files(files, config):
    out = _state["scratch"] / "generated"
    for script in ("make_gallery.py", "make_viewer_shots.py"):
        subprocess.run([sys.executable, str(GALLERY / script), "--out", str(out)], cwd=ROOT,
                       check=True, stdout=subprocess.DEVNULL)
    for png in sorted(out.glob("*.png")):
        files.append(File(f"generated/{png.name}", str(_state["scratch"]), config["site_dir"],
                          config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    session = page.file.src_uri

    def executed(match: re.Match) -> str:
        if match.group(1):  # not run: shown as written
            return match.group(0)
        code = match.group(2)
        shown = ' result="text"' if "print(" in code else ""
        return f'```python exec="on" source="above" session="{session}"{shown}\n{code}```'

    return PLAIN.sub(executed, markdown)


def on_post_build(config):
    live = Path(config["site_dir"]) / "live"
    live.mkdir(exist_ok=True)
    for page in _state["scratch"].glob("*.html"):
        shutil.copy2(page, live / page.name)
    _leave()


def on_build_error(error):
    _leave()


def _leave() -> None:
    """Back to where the build started; the scratch folder removed."""
    if "scratch" in _state:
        os.chdir(_state.pop("cwd"))
        shutil.rmtree(_state.pop("scratch"), ignore_errors=True)
