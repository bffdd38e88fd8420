"""Attention patterns as pictures: the html viewer's attention panel (headless Chromium, network
off) and ``torchlens.viz.save_patterns``'s static SVG, on a 2-layer GPT-2 whose
``blocks.*.attn.hook_pattern`` were saved. A trace without patterns has no panel."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
import torch

import torchlens as tl
from torchlens.errors import TorchLensError
from torchlens.viz import attention, save_patterns

HEADS = 4
WORDS = ["<eos>", "the", "cat", "sat", "on", "mat"]
TEXT = "the cat sat on the mat"
TOKENS = TEXT.split()
SVG = "{http://www.w3.org/2000/svg}"


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=HEADS, vocab_size=len(WORDS),
                        n_positions=16, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config).eval()


def _tokenizer():
    """A word-level tokenizer built in memory (no hub, no files)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<eos>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=words, eos_token="<eos>", unk_token="<eos>")


@pytest.fixture(scope="module")
def text_trace() -> tl.Trace:
    """Text through the model's tokenizer: the trace knows its tokens."""
    return tl.trace(_gpt2(), TEXT, tokenizer=_tokenizer(),
                    save=["blocks.*.attn.hook_pattern"])


@pytest.fixture(scope="module")
def ids_trace() -> tl.Trace:
    """Token ids as a tensor: no tokens known, the axes are positions."""
    torch.manual_seed(1)
    return tl.trace(_gpt2(), torch.randint(0, len(WORDS), (2, 5)),
                    save=["blocks.*.attn.hook_pattern"])


def _pattern(trace, layer: int) -> torch.Tensor:
    return trace[f"blocks.{layer}.attn.hook_pattern"].out[0]


def _texts(locator) -> list[str]:
    return [locator.nth(i).text_content() for i in range(locator.count())]


def _hover_value(v, head: int, q: int, k: int) -> float:
    cell = v.page.locator(f'#attention figure[data-head="{head}"] '
                          f'rect.cell[data-q="{q}"][data-k="{k}"]')
    cell.hover()
    tip = v.page.locator("#attn-tip")
    assert tip.is_visible()
    assert tip.inner_text().startswith(f"head {head} · query {q}")
    return float(tip.inner_text().rsplit(": ", 1)[1])


def test_clicking_the_attention_op_opens_one_heatmap_per_head(text_trace, tmp_path,
                                                              open_viewer):
    path = tmp_path / "gpt2-attention.html"
    text_trace.draw(path=path)
    v = open_viewer(path)
    panel = v.page.locator("#attention")
    assert not panel.is_visible()  # closed until asked for
    op = text_trace.meta["names"]["blocks.0.attn.hook_pattern"]
    v.page.locator(f'#scene g.node[data-title="{op}"]').click()
    assert panel.is_visible()
    heads = panel.locator("figure.attn-head")
    assert heads.count() == HEADS
    n = len(TOKENS)
    for h in range(HEADS):
        assert heads.nth(h).locator("rect.cell").count() == n * n
    first = heads.nth(0)
    assert _texts(first.locator("text.qlabel")) == TOKENS  # queries down the side
    assert _texts(first.locator("text.klabel")) == TOKENS  # keys along the top
    expected = _pattern(text_trace, 0)
    for head, q, k in [(0, 0, 0), (2, 4, 1), (3, 5, 5)]:
        assert _hover_value(v, head, q, k) == pytest.approx(expected[head, q, k].item(),
                                                            abs=1e-3)
    _hover_value(v, 2, 4, 1)  # the tooltip names the tokens
    assert 'query 4 "the" → key 1 "cat": ' in v.page.locator("#attn-tip").inner_text()
    v.page.select_option("#attn-layer", "1")  # the layer list: layer 1's heads instead
    expected = _pattern(text_trace, 1)
    assert _hover_value(v, 1, 3, 2) == pytest.approx(expected[1, 3, 2].item(), abs=1e-3)
    assert "blocks.1.attn.hook_pattern" in panel.locator(".attn-what").inner_text()
    v.shot("gpt2-attention")
    assert v.errors == [] and v.blocked == []


def test_the_attention_button_and_the_attention_module_open_the_panel(text_trace, tmp_path,
                                                                      open_viewer):
    path = tmp_path / "gpt2-auto.html"
    text_trace.draw(path=path, collapse="auto")
    v = open_viewer(path)
    panel = v.page.locator("#attention")
    v.page.locator("#attention-btn").click()
    assert panel.is_visible() and panel.locator("figure.attn-head").count() == HEADS
    v.page.locator("#attn-close").click()
    assert not panel.is_visible()
    module = text_trace[text_trace.meta["names"]["blocks.1.attn.hook_pattern"]].module
    v.page.fill("#search", module)  # selects the module's box, wherever it sits
    v.page.press("#search", "Enter")
    assert panel.is_visible()
    assert panel.locator(".attn-heads").get_attribute("data-layer") == "1"
    assert panel.locator("#attn-layer").input_value() == "1"
    assert v.errors == [] and v.blocked == []


def test_without_tokens_the_axes_are_positions(ids_trace, tmp_path, open_viewer):
    path = tmp_path / "ids.html"
    ids_trace.draw(path=path)
    v = open_viewer(path)
    v.page.locator("#attention-btn").click()
    first = v.page.locator("#attention figure.attn-head").first
    assert _texts(first.locator("text.qlabel")) == ["0", "1", "2", "3", "4"]
    expected = _pattern(ids_trace, 0)  # batch row 0
    assert _hover_value(v, 1, 4, 2) == pytest.approx(expected[1, 4, 2].item(), abs=1e-3)
    assert v.errors == []


def test_a_trace_without_patterns_has_no_panel(gpt2_tiny, tmp_path, open_viewer):
    path = tmp_path / "plain.html"
    gpt2_tiny.draw(path=path)
    v = open_viewer(path)
    assert v.page.evaluate("window.torchlens.data.attention") is None
    assert v.page.locator("#attention-btn").count() == 0
    assert v.page.locator("#attention").count() == 0
    sdpa = v.page.locator('#scene g.node[data-title^="scaled_dot_product_attention"]').first
    sdpa.click()  # the attention op still selects as any op does
    assert v.page.locator("#details h2").inner_text().startswith("scaled_dot_product_attention")
    assert v.errors == [] and v.blocked == []


def test_the_page_caps_positions_and_numbers_and_says_so(text_trace, monkeypatch):
    full = attention.page_patterns(text_trace)
    assert full["note"] is None and full["tokens"] == TOKENS and full["n_tokens"] == 6
    assert [layer["heads"] for layer in full["layers"]] == [HEADS, HEADS]
    stored = torch.tensor(full["layers"][0]["values"]) * full["scale"]
    assert torch.allclose(stored, _pattern(text_trace, 0), atol=1e-4)
    monkeypatch.setattr(attention, "MAX_POSITIONS", 4)
    monkeypatch.setattr(attention, "MAX_VALUES", HEADS * 4 * 4)  # room for one layer
    capped = attention.page_patterns(text_trace)
    (layer,) = capped["layers"]
    assert (layer["queries"], layer["keys"]) == (6, 6)
    assert torch.tensor(layer["values"]).shape == (HEADS, 4, 4)
    assert "first 4 queries and keys of 6" in capped["note"]
    assert "layers 1 left out" in capped["note"]


def _read_svg(path):
    root = ET.parse(path).getroot()
    out = {}
    for head in root.iter(f"{SVG}g"):
        if head.get("class") != "head":
            continue
        cells = {}
        for rect in head.iter(f"{SVG}rect"):
            title = rect.find(f"{SVG}title").text
            q, k = map(int, re.search(r"query (\d+)\b.* key (\d+)\b", title).groups())
            cells[q, k] = float(title.rsplit(": ", 1)[1])
        labels = [t.text for t in head.iter(f"{SVG}text") if t.get("class") == "query"]
        out[int(head.get("data-layer")), int(head.get("data-head"))] = (cells, labels)
    return out


def test_save_patterns_writes_one_heatmap_per_head(text_trace, ids_trace, tmp_path):
    written = save_patterns(text_trace, tmp_path / "attn.svg")
    assert written == (tmp_path / "attn.svg").resolve()
    heads = _read_svg(written)
    assert sorted(heads) == [(layer, h) for layer in (0, 1) for h in range(HEADS)]
    for (layer, h), (cells, labels) in heads.items():
        assert labels == TOKENS
        expected = _pattern(text_trace, layer)[h]
        assert len(cells) == len(TOKENS) ** 2
        assert all(cells[q, k] == pytest.approx(expected[q, k].item(), abs=1e-3)
                   for q, k in cells)
    one = _read_svg(save_patterns(ids_trace, tmp_path / "layer1.svg", layer=1))
    assert sorted(one) == [(1, h) for h in range(HEADS)]
    cells, labels = one[1, 2]
    assert labels == ["0", "1", "2", "3", "4"] and len(cells) == 25
    assert cells[3, 1] == pytest.approx(_pattern(ids_trace, 1)[2, 3, 1].item(), abs=1e-3)
    page = save_patterns(ids_trace, tmp_path / "attn.html", layer=0).read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count('class="head"') == HEADS


def test_save_patterns_keeps_to_the_cap_and_says_so(text_trace, tmp_path, monkeypatch):
    monkeypatch.setattr(attention, "MAX_POSITIONS", 4)
    monkeypatch.setattr(attention, "MAX_VALUES", HEADS * 4 * 4)  # room for one layer
    path = save_patterns(text_trace, tmp_path / "capped.svg")
    heads = _read_svg(path)
    assert sorted(heads) == [(0, h) for h in range(HEADS)]
    cells, labels = heads[0, 0]
    assert labels == TOKENS[:4] and len(cells) == 16
    note = "".join(ET.parse(path).getroot().find(f"{SVG}text[@class='note']").itertext())
    assert "first 4 queries and keys of 6" in note and "layers 1 left out" in note


def test_save_patterns_refuses_with_the_next_command(gpt2_tiny, text_trace, tmp_path):
    with pytest.raises(TorchLensError) as info:
        save_patterns(gpt2_tiny, tmp_path / "none.svg")
    assert info.value.code == "activation_not_saved"
    assert any("hook_pattern" in t for t in info.value.teach)
    with pytest.raises(TorchLensError) as info:
        save_patterns(text_trace, tmp_path / "x.svg", layer=7)
    assert info.value.code == "key_not_found" and "layer=0" in info.value.teach[0]
    with pytest.raises(TorchLensError) as info:
        save_patterns(text_trace, tmp_path / "x.png")
    assert info.value.code == "draw_option_invalid"
    assert not list(tmp_path.iterdir())


def test_the_search_takes_transformer_names(ids_trace, tmp_path, open_viewer):
    path = tmp_path / "names.html"
    ids_trace.draw(path=path, collapse="none")
    v = open_viewer(path)
    names = tl.transformer(ids_trace).names
    assert "blocks.1.hook_resid_post" in names and "blocks.0.attn.hook_z" in names

    def hits(query):
        v.page.fill("#search", query)
        v.page.press("#search", "Enter")
        return v.page.locator("#hits").inner_text()

    assert hits("blocks.1.hook_resid_post") == "1 of 1"  # a name of the model, bound or not
    label = tl.transformer(ids_trace).structure.blocks[1].resid_post
    assert label in v.page.locator("#details").inner_text()
    assert hits("blocks.*.hook_resid_post") == "1 of 2"  # a glob over names
    assert v.errors == []
