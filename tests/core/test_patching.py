"""tl.patching.sweep on a small sequence model: every cell equals the same patch written with a
forward hook, batching changes nothing, and bad sweeps refuse before any forward."""

from __future__ import annotations

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
    assert grid.forwards == 15


def test_batching_cells_gives_the_same_grid_in_fewer_forwards():
    model, clean, corrupt = _setup()
    adds = [op.label for op in tl.trace(model, clean, save=None) if op.func == "add"]
    one = tl.patching.sweep(model, clean, corrupt, sites=["blocks.*", adds[1]], metric=metric)
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
    assert f"{grid.values[0, 1].item():.2f}" in page


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
    grid = tl.patching.sweep(model, clean, corrupt, sites="fc", metric=out_metric)
    assert grid.values.shape == (1, 5)
