"""Screenshots of the html viewer for the gallery: collapsed, expanded, searched, coloured.

Run from the repository root: ``python docs/gallery/make_viewer_shots.py`` (needs torchvision,
transformers, torchlens-viz, Playwright and Debian's ``chromium``). Opens each page offline in
headless Chromium, as the tests do, and writes ``viewer-*.png`` next to this file, or into
``--out DIR`` (the documentation build's own copies).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository root, for tests.viz.browser

import torch  # noqa: E402

import torchlens as tl  # noqa: E402


def pages(folder: Path) -> dict[str, Path]:
    import torchvision
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    resnet = torchvision.models.resnet18(weights=None).eval()
    config = GPT2Config(n_layer=12, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
                        use_cache=False, bos_token_id=99, eos_token_id=99)
    gpt2 = GPT2LMHeadModel(config).eval()
    return {
        "resnet18": tl.draw(resnet, torch.randn(1, 3, 224, 224),
                            path=folder / "resnet18.html").path,
        "gpt2": tl.draw(gpt2, {"input_ids": torch.randint(0, 100, (1, 8))},
                        path=folder / "gpt2.html").path,
    }


def main(out: Path = HERE) -> int:
    from playwright.sync_api import sync_playwright

    from tests.viz.browser import CHROMIUM_ARGS, Viewer, chromium_path

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        made = pages(Path(tmp))
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)

        def shoot(name: str, page: str, *steps) -> None:
            viewer = Viewer(browser, made[page], width=1280, height=800)
            for step in steps:
                step(viewer.page)
            viewer.page.screenshot(path=str(out / f"viewer-{name}.png"))
            assert not viewer.errors, viewer.errors
            viewer.close()
            print("wrote", out / f"viewer-{name}.png")

        def search(text: str):
            return lambda page: (page.fill("#search", text), page.press("#search", "Enter"))

        shoot("gpt2-collapsed", "gpt2")
        shoot("gpt2-expanded", "gpt2",
              lambda page: page.locator("#scene g.cluster.folded text.head").click(),
              lambda page: page.locator("#scene g.node.folded").click(),
              lambda page: page.locator('#scene g.node[data-address="transformer.h.3"]').click(),
              lambda page: page.click("#fit"))
        shoot("resnet18-searched", "resnet18", search("layer3.1.conv2"),
              lambda page: page.locator("#scene g.node.current").click())
        shoot("resnet18-flops", "resnet18", lambda page: page.select_option("#color", "flops"),
              lambda page: page.click("#fit"))
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else HERE))
