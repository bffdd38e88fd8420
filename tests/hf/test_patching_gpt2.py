"""tl.patching.sweep on a transformers GPT-2 built from a config: each cell equals the same patch
made with a forward hook on the block, and a batched sweep equals one forward per cell."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl
from tests.models.hf import build_gpt2_tiny


def test_gpt2_residual_sweep_equals_hooks_and_batches(tmp_path):
    model, clean = build_gpt2_tiny()
    corrupt = dict(clean, input_ids=(clean["input_ids"] + 3) % 100)

    def metric(out):
        return out.logits[0, -1, 5] - out.logits[0, -1, 7]

    grid = tl.patching.sweep(model, clean, corrupt, sites=["transformer.h.*"], metric=metric,
                             batch_size=1)
    batched = tl.patching.sweep(model, clean, corrupt, sites=["transformer.h.*"],
                                metric=metric, batch_size=6)
    assert torch.allclose(grid.raw, batched.raw, atol=1e-5)
    assert batched.forwards < grid.forwards
    with torch.no_grad():
        for i, block in enumerate(model.transformer.h):
            saved = {}
            handle = block.register_forward_hook(
                lambda m, a, o, saved=saved: saved.setdefault("v", o))
            model(**clean)
            handle.remove()
            for j in range(grid.raw.shape[1]):
                def patch(m, a, o, j=j, saved=saved):
                    o = o.clone()
                    o[:, j] = saved["v"][:, j]
                    return o
                handle = block.register_forward_hook(patch)
                try:
                    expected = float(metric(model(**corrupt)))
                finally:
                    handle.remove()
                assert grid.raw[i, j].item() == pytest.approx(expected, abs=1e-5)
    # the last block at the last position carries everything the metric reads
    assert grid.values[-1, -1].item() == pytest.approx(1.0, abs=1e-4)
    frame = grid.to_pandas()
    assert list(frame.index) == ["transformer.h.0", "transformer.h.1"]
    assert list(frame.columns) == list(range(8))
