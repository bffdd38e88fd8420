"""Trace.save / tl.load: exact round trip, no code execution, typed refusal of bad files."""

from __future__ import annotations

import json
import os
import pickle

import pytest
import torch

import torchlens as tl
from tests.models.zoo import PURE_CASES


def _same(a: tl.Trace, b: tl.Trace) -> None:
    assert a.rows() == b.rows()
    assert json.dumps(a.params, sort_keys=True) == json.dumps(b.params, sort_keys=True)
    assert a.output_structure == b.output_structure and a.meta == b.meta
    assert a.provenance == b.provenance and a.annotations == b.annotations
    assert {k: [c.row() for c in m.calls] for k, m in a.modules.items()} == {
        k: [c.row() for c in m.calls] for k, m in b.modules.items()}
    for x, y in zip(a, b):
        if x.saved:
            vx, vy = x.out, y.out
            if isinstance(vx, tuple):
                assert all(torch.equal(p, q) for p, q in zip(vx, vy))
            else:
                assert torch.equal(vx, vy) and vx.dtype == vy.dtype


@pytest.mark.parametrize("name", ["recurrent", "views_indexing", "dict_output", "lstm"])
def test_round_trip_is_exact(tmp_path, name):
    model, x = PURE_CASES[name].build()
    trace = tl.trace(model, x)
    path = tmp_path / "t.tl"
    trace.save(path)
    loaded = tl.load(path)
    _same(trace, loaded)
    assert loaded["linear_1"].module == trace["linear_1"].module


def test_metadata_only_round_trip(tmp_path):
    model, x = PURE_CASES["cnn_bn"].build()
    trace = tl.trace(model, x, save=None)
    trace.save(tmp_path / "m.tl")
    _same(trace, tl.load(tmp_path / "m.tl"))


@pytest.fixture()
def good_file(tmp_path):
    model, x = PURE_CASES["mlp"].build()
    path = tmp_path / "good.tl"
    tl.trace(model, x).save(path)
    return path


def _refused(path):
    with pytest.raises(tl.TorchLensError) as err:
        tl.load(path)
    assert err.value.code == "trace_file_invalid"
    assert isinstance(err.value, ValueError)


def test_corrupt_file_refused(good_file, tmp_path):
    data = bytearray(good_file.read_bytes())
    for i in range(100, len(data), 97):
        data[i] ^= 0xFF
    bad = tmp_path / "corrupt.tl"
    bad.write_bytes(bytes(data))
    _refused(bad)
    (tmp_path / "noise.tl").write_bytes(os.urandom(4096))
    _refused(tmp_path / "noise.tl")


def test_truncated_file_refused(good_file, tmp_path):
    data = good_file.read_bytes()
    for cut in (10, len(data) // 2, len(data) - 30):
        bad = tmp_path / f"cut{cut}.tl"
        bad.write_bytes(data[:cut])
        _refused(bad)


def test_foreign_files_refused(tmp_path):
    torch.save({"weight": torch.ones(2)}, tmp_path / "state.pt")
    _refused(tmp_path / "state.pt")
    (tmp_path / "x.json").write_text("{}")
    _refused(tmp_path / "x.json")
    _refused(tmp_path / "missing.tl")


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/torchlens_pwned",))


def test_loading_runs_no_code(tmp_path):
    path = tmp_path / "evil.tl"
    torch.save({"format": "torchlens-trace", "meta_json": "{}", "tensors": {}, "x": Evil()},
               path, pickle_module=pickle)
    _refused(path)
    assert not os.path.exists("/tmp/torchlens_pwned")


def test_inconsistent_contents_refused(good_file, tmp_path):
    payload = torch.load(good_file, weights_only=True)
    meta = json.loads(payload["meta_json"])
    meta["ops"][0].pop("label")
    payload["meta_json"] = json.dumps(meta)
    torch.save(payload, tmp_path / "bad.tl")
    _refused(tmp_path / "bad.tl")


def test_a_saved_view_of_another_dtype_saves_and_loads(tmp_path):
    """``fft(x).real`` (FNet) and ``view(torch.int32)`` keep views of a saved value as another
    dtype; the file holds them (``torch.save`` refuses one storage seen as two dtypes) and they
    load equal."""

    class Views(torch.nn.Module):
        def forward(self, x):
            return torch.fft.fft(x).real * 2, (x * 1).view(torch.int32) + 0

    trace = tl.trace(Views(), torch.randn(2, 8), save="all")
    path = tmp_path / "views.tl"
    trace.save(path)
    loaded = tl.load(path)
    for label in ("fft_fft_1", "real_1", "view_1", "output_1", "output_2"):
        assert torch.equal(loaded[label].out, trace[label].out), label


class _Tagged(torch.Tensor):
    """A tensor subclass the safe loader does not know."""


def test_values_of_a_tensor_subclass_save_as_plain_tensors_and_load(tmp_path):
    """``tl.load`` reads with ``weights_only=True``: a trace whose saved values are of a tensor
    subclass (a torchvision ``tv_tensors.Image`` input, say) is written as plain tensors."""
    model, x = torch.nn.Linear(4, 4), torch.randn(2, 4).as_subclass(_Tagged)
    trace = tl.trace(model, x)
    assert type(trace["linear_1"].out) is _Tagged  # the trace in memory keeps the class
    trace.save(tmp_path / "tagged.tl")
    loaded = tl.load(tmp_path / "tagged.tl")
    for label in ("input_1", "linear_1", "output_1"):
        assert type(loaded[label].out) is torch.Tensor
        assert torch.equal(loaded[label].out, trace[label].out.as_subclass(torch.Tensor))
