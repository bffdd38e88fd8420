"""tl.patching.sweep on a small sequence model: every cell equals the same patch written with a
forward hook, batching changes nothing, and bad sweeps refuse before any forward."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import torchlens as tl
from tests.core.test_edits import Net


def _setup():
    torch.manual_seed(0)
    model = Net().eval()
    clean, corrupt = torch.randn(1, 5, 4), torch.randn(1, 5, 4)
    return model, clean, corrupt


def metric(out):
    return out[0, -1, 0] - out[0, -1, 1]


def _by_hand(model, clean, corrupt, address, position):
    module = model.get_submodule(address)
    with torch.no_grad():
        saved = {}
        handle = module.register_forward_hook(lambda m, a, o: saved.setdefault("v", o))
        model(clean)
        handle.remove()

        def patch(m, a, o):
            o = o.clone()
            o[:, position] = saved["v"][:, position]
            return o
        handle = module.register_forward_hook(patch)
        try:
            return float(metric(model(corrupt)))
        finally:
            handle.remove()


def test_every_cell_equals_a_hand_written_hook_and_is_normalised():
    model, clean, corrupt = _setup()
    grid = tl.patching.sweep(model, clean, corrupt, sites=["blocks.*"], metric=metric)
    assert grid.sites == ["blocks.0", "blocks.1", "blocks.2"] and grid.positions == [0, 1, 2, 3, 4]
    for i, site in enumerate(grid.sites):
        for j in range(5):
            assert grid.raw[i, j].item() == pytest.approx(
                _by_hand(model, clean, corrupt, site, j), abs=1e-5)
    with torch.no_grad():
        c, k = float(metric(model(clean))), float(metric(model(corrupt)))
    assert grid.clean_metric == pytest.approx(c) and grid.corrupt_metric == pytest.approx(k)
    assert torch.allclose(grid.values, (grid.raw - k) / (c - k))
    # the last block patched at the last position carries everything the metric reads
    assert grid.values[2, 4].item() == pytest.approx(1.0, abs=1e-5)
    assert grid.forwards == 2 and grid.batch_size == 16  # by default 15 cells in one forward,
    # and the first cell alone beside it


def test_batching_cells_gives_the_same_grid_in_fewer_forwards():
    model, clean, corrupt = _setup()
    adds = [op.label for op in tl.trace(model, clean, save=None) if op.func == "add"]
    one = tl.patching.sweep(model, clean, corrupt, sites=["blocks.*", adds[1]], metric=metric,
                            batch_size=1)
    many = tl.patching.sweep(model, clean, corrupt, sites=["blocks.*", adds[1]], metric=metric,
                             batch_size=7)
    assert torch.allclose(one.raw, many.raw, atol=1e-6)
    assert one.forwards == 20 and many.forwards == 3 + 1  # 20 cells in 3 forwards, one check


def test_the_grid_prints_and_saves_a_self_contained_heatmap(tmp_path):
    model, clean, corrupt = _setup()
    grid = tl.patching.sweep(model, clean, corrupt, sites="blocks.1", metric=metric,
                             positions=[0, 4])
    text = str(grid)
    assert "blocks.1" in text and "2 forwards" in text and grid.values.shape == (1, 2)
    grid.save(tmp_path / "grid.html")
    page = (tmp_path / "grid.html").read_text()
    assert "<table>" in page and "blocks.1" in page and "<script" not in page and "http" not in page
    assert f"{grid.values[0, 1].item():.{grid.decimals}f}" in page


class BatchMixer(nn.Module):
    """Rows of a batch are not independent: each is centred on the batch mean."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        h = self.fc(x)
        return self.out(h - h.mean(0, keepdim=True) + h)


def test_bad_sweeps_refuse_before_any_forward(count_forwards):
    model, clean, corrupt = _setup()
    calls = count_forwards(model)
    for kwargs, code in [(dict(sites=["blocks.*.attn"]), "edit_site_unknown"),
                         (dict(sites=["blocks.0"], batch_size=0), "option_invalid"),
                         (dict(sites=[]), "option_invalid")]:
        with pytest.raises(tl.TorchLensError) as err:
            tl.patching.sweep(model, clean, corrupt, metric=metric, **kwargs)
        assert err.value.code == code
    with pytest.raises(tl.TorchLensError) as err:
        tl.patching.sweep(model, clean, torch.randn(1, 6, 4), sites="blocks.0", metric=metric)
    assert err.value.code == "patching_inputs_mismatch"
    with pytest.raises(tl.TorchLensError) as err:
        tl.patching.sweep(model, clean.repeat(2, 1, 1), corrupt.repeat(2, 1, 1),
                          sites="blocks.0", metric=metric, batch_size=2)
    assert err.value.code == "option_invalid"
    assert calls.n == 0
    with pytest.raises(tl.TorchLensError) as err:
        tl.patching.sweep(model, clean, corrupt, sites="blocks.0", metric=metric, positions=[9])
    assert err.value.code == "option_invalid"


def test_a_model_whose_batch_rows_mix_refuses_batching():
    torch.manual_seed(0)
    model = BatchMixer().eval()
    clean, corrupt = torch.randn(1, 5, 4), torch.randn(1, 5, 4)
    out_metric = lambda out: out[0].sum()  # noqa: E731
    with pytest.raises(tl.TorchLensError) as err:
        tl.patching.sweep(model, clean, corrupt, sites="fc", metric=out_metric, batch_size=4)
    assert err.value.code == "patching_batch_unsafe"
    # by default it batches only where the rows are independent: here a cell a forward
    grid = tl.patching.sweep(model, clean, corrupt, sites="fc", metric=out_metric)
    one = tl.patching.sweep(model, clean, corrupt, sites="fc", metric=out_metric, batch_size=1)
    assert grid.values.shape == (1, 5) and grid.batch_size == 1
    assert torch.equal(grid.raw, one.raw) and grid.forwards == one.forwards + 1  # the check


# ---- the heatmap reads: legend, a diverging scale, one precision, tokens ----------------------
def _numbers_shown(page: str) -> list[str]:
    """Every decimal number a reader sees: text, hover titles and legend ticks."""
    from html.parser import HTMLParser

    found: list[str] = []

    class Reader(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend(v for k, v in attrs if k == "title" and v)

        def handle_data(self, data):
            if self.lasttag not in ("style", "script"):
                found.append(data)

    Reader().feed(page)
    return re.findall(r"-?\d+\.\d+", " ".join(found))


def _rgb(style: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.search(r"rgb\((\d+),(\d+),(\d+)\)", style).groups())


def test_the_heatmap_has_a_legend_a_diverging_scale_and_one_precision(tmp_path):
    # the metrics of the issue: "0.424" beside "0.3958"; cells below 0, at 0, at 1 and past 1
    clean, corrupt = 0.424, 0.3958
    values = torch.tensor([[-0.5, 0.0, 0.5], [1.0, 1.5, 0.25]], dtype=torch.float64)
    grid = tl.patching.PatchingSweep(["blocks.0", "blocks.1"], [0, 1, 2],
                                     corrupt + values * (clean - corrupt), clean, corrupt, 1, 6,
                                     tokens=["the", "cat", "sat"])
    assert torch.allclose(grid.values, values)
    grid.save(tmp_path / "grid.html")
    page = (tmp_path / "grid.html").read_text()
    shown = _numbers_shown(page)
    assert "0.4240" in shown and "0.3958" in shown
    assert len(shown) == 2 + 4 + 2 * 6  # the heading, the ticks, each cell and its title
    assert {len(n.split(".")[1]) for n in shown} == {grid.decimals} == {4}
    assert {len(n.split(".")[1]) for n in re.findall(r"-?\d+\.\d+", str(grid))} == {4}
    # the legend: a diverging scale from -1.5 to 1.5 (the largest cell), 0 corrupt, 1 clean
    legend = re.search(r"<svg class='legend'.*?</svg>", page, re.S).group(0)
    assert "data-min='-1.5000'" in legend and "data-max='1.5000'" in legend
    ticks = re.findall(r"<text class='tick' data-v='([^']+)' x='([\d.]+)'[^>]*>([^<]*)</text>"
                       r"(?:<text class='name'[^>]*>([^<]*)</text>)?", legend)
    assert [(v, text, name) for v, _, text, name in ticks] == [
        ("-1.5000", "-1.5000", ""), ("1.5000", "1.5000", ""), ("0.0000", "0.0000", "corrupt"),
        ("1.0000", "1.0000", "clean")]
    low, high, zero, one = (float(x) for _, x, _, _ in ticks)
    assert low < zero < one < high and zero - low == pytest.approx(high - zero, abs=8)
    assert one - zero == pytest.approx((high - zero) / 1.5, abs=8)  # 1 where 1 falls
    stops = re.findall(r"stop-color='([^']+)'", legend)
    assert len(stops) == 9 and _rgb(stops[4]) == (247, 247, 247)  # white at 0
    cells = {v: colour for colour, v in
             re.findall(r"<td style='background:([^;]+);[^']*' data-v='([^']+)'", page)}
    white, half_red, half_blue = (_rgb(cells[k]) for k in ("0.0000", "0.5000", "-0.5000"))
    assert white == (247, 247, 247)
    assert half_red[0] > half_red[2] and half_blue[2] > half_blue[0]  # red up, blue down
    for half, end in ((half_red, _rgb(stops[8])), (half_blue, _rgb(stops[0]))):
        # +0.5 and -0.5 lie a third of the way (0.5 of 1.5) from white to their ends
        assert half == pytest.approx([w + (e - w) / 3 for w, e in zip(white, end)], abs=1)
    assert _rgb(cells["1.5000"]) == _rgb(stops[8])  # the largest cell is the scale's end
    # the tokens over their positions
    heads = re.findall(r"<th class='pos' data-pos='(\d+)'>\d+<br><span class='tok'>([^<]*)</span>",
                       page)
    assert heads == [("0", "the"), ("1", "cat"), ("2", "sat")]
    assert "<script" not in page and "http" not in page


def test_without_tokens_the_axis_is_positions_and_equal_baselines_show_as_nan(tmp_path):
    grid = tl.patching.PatchingSweep(["fc"], [0, -1], torch.tensor([[2.0, 3.0]]), 5.0, 1.0, 1, 2)
    assert grid.position_labels() == ["", ""] and grid.decimals == 3
    grid.save(tmp_path / "g.html")
    page = (tmp_path / "g.html").read_text()
    assert "class='tok'" not in page and "data-pos='-1'>-1</th>" in page
    assert "data-max='1.000'" in page and "NaN" not in page  # the scale ends at 1 (clean)
    tokens = tl.patching.PatchingSweep(["fc"], [0, -1], torch.tensor([[2.0, 3.0]]), 5.0, 1.0,
                                       1, 2, tokens=["a", "b", "c"])
    assert tokens.position_labels() == ["a", "c"]  # a negative position counts from the end
    assert tokens._num(-1e-9) == "0.000" and tokens._num(-0.0005) == "-0.001"
