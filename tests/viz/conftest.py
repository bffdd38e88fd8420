"""Shared traces for the drawing tests: captured once per session, metadata only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.models import CASES


def capture(name: str) -> tl.Trace:
    model, x = CASES[name].build()
    return tl.trace(model, x, save="none")


@pytest.fixture(scope="session")
def residual() -> tl.Trace:
    return capture("residual")


@pytest.fixture(scope="session")
def recurrent() -> tl.Trace:
    return capture("recurrent")


@pytest.fixture(scope="session")
def gpt2_tiny() -> tl.Trace:
    return capture("gpt2_tiny")


@pytest.fixture(scope="session")
def gpt2_12() -> tl.Trace:
    """A 12-layer GPT-2 (narrow, so it builds fast; the op graph is the full one, ~500 ops)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=12, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
                        use_cache=False, bos_token_id=99, eos_token_id=99)
    model = GPT2LMHeadModel(config).eval()
    return tl.trace(model, {"input_ids": torch.randint(0, 100, (1, 8))}, save="none")


class Block(nn.Module):
    """A residual MLP block; N of them in a row are "identical consecutive siblings"."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(self.norm(x)))


class Stack(nn.Module):
    """``n`` identical blocks, then one block of another width (which must not fold in)."""

    def __init__(self, n: int):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList(Block(8) for _ in range(n))
        self.proj = nn.Linear(8, 6)
        self.last = Block(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.last(self.proj(x))


def stack_trace(n: int) -> tl.Trace:
    torch.manual_seed(0)
    return tl.trace(Stack(n).eval(), torch.randn(2, 4), save="none")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run in an empty folder, as a plain script (never a notebook)."""
    from torchlens.viz import output

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(output, "in_notebook", lambda: False)
    return tmp_path


@pytest.fixture(scope="session")
def chromium():
    """One headless Chromium for the whole session (Debian's, driven by Playwright)."""
    from playwright.sync_api import sync_playwright

    from tests.viz.browser import CHROMIUM_ARGS, chromium_path

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def open_viewer(chromium):
    """Open an html drawing in a fresh offline page: ``open_viewer(path) -> Viewer``."""
    from tests.viz.browser import Viewer

    opened = []

    def _open(path, **size):
        viewer = Viewer(chromium, path, **size)
        opened.append(viewer)
        return viewer

    yield _open
    for viewer in opened:
        viewer.close()


@pytest.fixture(scope="session")
def resnet18_trace() -> tl.Trace:
    """torchvision's resnet18 (random weights), 1×3×224×224, metadata only."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    return tl.trace(model, torch.randn(1, 3, 224, 224), save="none")
