"""Headless Chromium for the viewer tests: one browser per session, the network switched off.

Debian's ``chromium`` is driven by Playwright (``executable_path``); ``.ci/run`` installs both.
Every page is opened from a file with an offline context whose every non-file request is
aborted and recorded, so a page that reached for the network fails its test.
"""

from __future__ import annotations

import shutil
from pathlib import Path

OUTPUT = Path(__file__).resolve().parents[2] / "test-output" / "viewer"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]


def chromium_path() -> str:
    """Debian's chromium (the one .ci/run installs)."""
    return shutil.which("chromium") or "/usr/bin/chromium"


class Viewer:
    """One opened page: its console errors, blocked requests, and helpers the tests share."""

    def __init__(self, browser, path: Path, *, width: int = 1400, height: int = 900,
                 wait: bool = True):
        self.context = browser.new_context(offline=True,
                                           viewport={"width": width, "height": height})
        self.errors: list[str] = []
        self.blocked: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error"
                     else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(path.resolve().as_uri())
        if wait:  # the viewer marks its body once the first view is drawn
            self.page.wait_for_selector("body[data-ready='1']", timeout=20_000)

    def _route(self, route) -> None:
        url = route.request.url
        if url.startswith(("file:", "data:", "about:")):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()

    def nodes(self) -> int:
        """How many node boxes the graph shows."""
        return self.page.locator("#scene g.node").count()

    def fills(self) -> list[str]:
        return self.page.eval_on_selector_all("#scene g.node > rect",
                                              "els => els.map(e => e.getAttribute('fill'))")

    def shot(self, name: str) -> Path:
        """A screenshot under test-output/viewer/ (gitignored), for a person to look at."""
        OUTPUT.mkdir(parents=True, exist_ok=True)
        target = OUTPUT / f"{name}.png"
        self.page.screenshot(path=str(target))
        return target

    def close(self) -> None:
        self.context.close()
