"""tl.record(..., to=): the sharded store on disk, read back memory-mapped (issue 14)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import torchlens as tl
from tests.models.zoo import PURE_CASES, seeded


class TokenModel(nn.Module):
    """Per-token values under an attention mask, like a tokenizer-fed encoder."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 6)
        self.proj = nn.Linear(6, 6)

    def forward(self, input_ids, attention_mask):
        return self.proj(self.emb(input_ids)) * attention_mask.unsqueeze(-1)


def token_inputs() -> list[dict[str, torch.Tensor]]:
    """Three batches with different padding (right and left), 2 examples each."""
    with seeded(3):
        ids = [torch.randint(1, 20, (2, t)) for t in (5, 3, 4)]
    masks = [torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]),
             torch.tensor([[1, 1, 1], [0, 1, 1]]),
             torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]])]
    return [{"input_ids": i, "attention_mask": m} for i, m in zip(ids, masks)]


def token_model() -> TokenModel:
    with seeded(4):
        return TokenModel().eval()


def recurrent_inputs(n: int = 5):
    model, x = PURE_CASES["recurrent"].build()
    return model, [x * (k + 1) for k in range(n)]


def test_store_reads_back_exactly_what_memory_holds(tmp_path):
    model, xs = recurrent_inputs()
    memory = tl.record(model, xs, save=["cell", "linear_2"], progress=False)
    rec = tl.record(model, xs, save=["cell", "linear_2"], to=tmp_path / "acts",
                    shard_bytes=200, progress=False)
    assert len(rec) == 10 and rec.labels == memory.labels
    assert len(rec.manifest["shards"]) > 1  # small shards: reads cross shard boundaries
    for label in rec.labels:
        assert torch.equal(rec[label][0:10], memory[label])
        assert torch.equal(rec[label][3:7], memory[label][3:7])
        assert torch.equal(rec[label][-1], memory[label][-1])
        assert torch.equal(rec[label][[9, 0, 4]], memory[label][[9, 0, 4]])
        assert torch.equal(rec[label].row(5), memory[label][5])
    files = {p.suffix for p in (tmp_path / "acts").rglob("*") if p.is_file()}
    assert files == {".json", ".safetensors"}  # no pickle anywhere


def test_manifest_records_what_a_store_needs(tmp_path):
    model, xs = recurrent_inputs(3)
    tl.record(model, xs, save=["cell"], to=tmp_path, dtype=torch.float16, progress=False)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["format"] == "torchlens-recording" and m["version"] == 1
    assert m["labels"]["cell"] == {"shape": [8], "dtype": "float16", "ragged": False}
    assert m["rows"] == 6 and m["status"] == "complete"
    assert m["selection"] == {"save": ["cell"]}
    assert m["options"]["dtype"] == "float16"
    assert m["model"]["class"].endswith("Recurrent") and m["model"]["parameters"] == sum(
        p.numel() for p in model.parameters()) and len(m["model"]["state_hash"]) == 64
    assert m["versions"]["torch"] == torch.__version__ and m["versions"]["torchlens"]
    assert m["provenance"]["origins"] == {"gold": 3}


def test_padded_positions_are_never_stored(tmp_path):
    model, inputs = token_model(), token_inputs()
    with seeded(5):  # and a batch with no padding at all
        inputs.append({"input_ids": torch.randint(1, 20, (2, 4)),
                       "attention_mask": torch.ones(2, 4, dtype=torch.long)})
    rec = tl.record(model, inputs, save=["proj"], to=tmp_path, progress=False)
    view = rec["proj"]
    assert view.ragged and len(view) == 8
    expected = []
    for batch in inputs:
        full = tl.trace(model, batch)["proj"].out
        for i in range(2):
            expected.append(full[i][batch["attention_mask"][i].bool()])
    for i, want in enumerate(expected):
        assert torch.equal(view.row(i), want)
    tokens = view.tokens()
    real = sum(int(b["attention_mask"].sum()) for b in inputs)
    assert len(tokens) == real
    assert torch.equal(tokens[0:real], torch.cat(expected))
    assert torch.equal(tokens[[real - 1]], expected[-1][-1:])
    shard = rec.shard(0).tensor("proj")
    assert tuple(shard.shape) == (real, 6)  # the file holds real tokens only
    # a shard per forward or two: staging buffers reused and grown across shards
    small = tl.record(model, inputs, save=["proj"], to=tmp_path / "small", shard_bytes=100,
                      progress=False)
    assert len(small.manifest["shards"]) > 2
    assert torch.equal(small["proj"].tokens()[0:real], tokens[0:real])
    assert all(torch.equal(small["proj"].row(i), want) for i, want in enumerate(expected))


def test_reduce_and_dtype_apply_before_storing(tmp_path):
    model, inputs = token_model(), token_inputs()
    rec = tl.record(model, inputs, save=["proj", "emb"], to=tmp_path,
                    reduce={"proj": "mean", "emb": "last"}, dtype=torch.bfloat16,
                    progress=False)
    mean_rows, last_rows = [], []
    for batch in inputs:
        log = tl.trace(model, batch)
        mask = batch["attention_mask"].bool()
        for i in range(2):
            mean_rows.append(log["proj"].out[i][mask[i]].mean(0))
            last_rows.append(log["emb"].out[i][mask[i].nonzero()[-1, 0]])
    assert not rec["proj"].ragged and rec["proj"].dtype == torch.bfloat16
    assert torch.allclose(rec["proj"][0:6].float(), torch.stack(mean_rows), atol=1e-2)
    assert torch.equal(rec["emb"][0:6], torch.stack(last_rows).to(torch.bfloat16))
    callable_rec = tl.record(model, inputs, save=["proj"], to=tmp_path / "amax",
                             reduce=lambda t: t.amax(dim=1), progress=False)
    assert tuple(callable_rec["proj"][0:6].shape) == (6, 6)


def test_batches_and_dataset_stream_every_row(tmp_path):
    model, xs = recurrent_inputs(6)
    rec = tl.record(model, xs, save=["cell"], to=tmp_path, shard_bytes=300, progress=False)
    everything = rec["cell"][0:12]
    plain = list(rec.batches("cell", batch_size=5))
    assert [len(b) for b in plain] == [5, 5, 2] and torch.equal(torch.cat(plain), everything)
    a = torch.cat(list(rec.batches("cell", batch_size=4, shuffle=True, seed=7)))
    b = torch.cat(list(rec.batches("cell", batch_size=4, shuffle=True, seed=7)))
    c = torch.cat(list(rec.batches("cell", batch_size=4, shuffle=True, seed=8)))
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, everything)
    order = torch.randperm(12, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, everything[order])  # every row exactly once
    assert [len(x) for x in rec.batches("cell", batch_size=5, drop_last=True)] == [5, 5]
    loader = DataLoader(rec.dataset("cell"), batch_size=4)
    assert torch.equal(torch.cat(list(loader)), everything)
    tokens = tl.record(token_model(), token_inputs(), save=["proj"], to=tmp_path / "tok",
                       progress=False)
    ds = tokens.dataset("proj")
    assert len(ds) == len(tokens["proj"].tokens()) and torch.equal(ds[0], tokens["proj"].row(0)[0])


class Interrupt(Exception):
    pass


def _interrupted(items, at):
    for k, item in enumerate(items):
        if k == at:
            raise Interrupt
        yield item


def test_the_same_call_again_resumes_after_the_last_whole_input(tmp_path, count_forwards):
    model, xs = recurrent_inputs(6)
    reference = tl.record(model, xs, save=["cell"], to=tmp_path / "ref", progress=False)
    with pytest.raises(Interrupt):
        tl.record(model, _interrupted(xs, 4), save=["cell"], to=tmp_path / "acts",
                  progress=False)
    partial = tl.recording.open(tmp_path / "acts")
    assert len(partial) == 8 and not partial.complete  # inputs 0-3 were kept
    calls = count_forwards(model)
    rec = tl.record(model, xs, save=["cell"], to=tmp_path / "acts", progress=False)
    assert calls.n == 2 * 1  # only inputs 4 and 5 ran (no label check for a module address)
    assert rec.complete and torch.equal(rec["cell"][0:12], reference["cell"][0:12])
    again = tl.record(model, xs, save=["cell"], to=tmp_path / "acts", progress=False)
    assert calls.n == 2 and len(again) == 12  # a complete store: nothing to do


def test_a_store_of_another_model_selection_or_options_refuses(tmp_path):
    model, xs = recurrent_inputs(2)
    tl.record(model, xs, save=["cell"], to=tmp_path, progress=False)
    other, _ = recurrent_inputs(2)
    with torch.no_grad():
        other.cell.weight.add_(1)
    cases = [
        (lambda: tl.record(other, xs, save=["cell"], to=tmp_path, progress=False), "model"),
        (lambda: tl.record(model, xs, save=["linear_2"], to=tmp_path, progress=False),
         "save selection"),
        (lambda: tl.record(model, xs, save=["cell"], to=tmp_path, dtype=torch.float16,
                           progress=False), "options"),
    ]
    for call, named in cases:
        with pytest.raises(tl.TorchLensError) as err:
            call()
        assert err.value.code == "recording_mismatch" and named in err.value.message
        assert "overwrite=True" in err.value.teach[0]
    rec = tl.record(model, xs, save=["cell"], to=tmp_path, dtype=torch.float16, overwrite=True,
                    progress=False)
    assert rec["cell"].dtype == torch.float16 and len(rec) == 4


def test_bad_input_refuses_before_any_recording(tmp_path, count_forwards):
    model, xs = recurrent_inputs(2)
    calls = count_forwards(model)
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(model, xs, save=["nope_1"], to=tmp_path / "a", progress=False)
    assert err.value.code == "save_selection_invalid" and not (tmp_path / "a").exists()
    assert calls.n <= 1  # at most the dry_run check's metadata forward
    for empty in ([], iter([])):
        with pytest.raises(tl.TorchLensError) as err:
            tl.record(model, empty, save=["cell"], to=tmp_path / "b", progress=False)
        assert err.value.code == "inputs_empty"
    (tmp_path / "file").write_text("x")
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(model, xs, save=["cell"], to=tmp_path / "file", progress=False)
    assert err.value.code == "option_invalid" and "folder" in err.value.message
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(model, xs, save=["cell"], to=tmp_path / "c", reduce="median", progress=False)
    assert err.value.code == "option_invalid"
    assert calls.n <= 1


class Pair(nn.Module):
    def forward(self, x):
        return x + 1, x * 2


class PairModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.pair = Pair()

    def forward(self, x):
        a, b = self.pair(x)
        return a * b


def test_a_value_that_is_not_rows_refuses_by_name(tmp_path):
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(PairModel(), [torch.rand(2, 3)], save=["pair"], to=tmp_path, progress=False)
    assert err.value.code == "recording_value_unsupported" and "'pair'" in err.value.message


class Shapeless(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2


def test_an_input_that_changes_structure_names_its_index_and_keeps_earlier_rows(tmp_path):
    inputs = [torch.rand(2, 4), torch.rand(2, 4), torch.rand(2, 5), torch.rand(2, 4)]
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(Shapeless(), inputs, save=["relu_1"], to=tmp_path, progress=False)
    assert err.value.code == "recording_input_changed" and "input 2" in err.value.message
    rec = tl.recording.open(tmp_path)
    assert len(rec) == 4 and torch.equal(rec["relu_1"][0:4], torch.relu(torch.cat(inputs[:2])))


def test_open_refuses_what_is_not_a_store(tmp_path):
    with pytest.raises(tl.TorchLensError) as err:
        tl.recording.open(tmp_path / "missing")
    assert err.value.code == "recording_invalid"
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(tl.TorchLensError) as err:
        tl.recording.open(tmp_path)
    assert err.value.code == "recording_invalid"


def test_progress_bar_shows_rows_and_bytes(tmp_path, capsys):
    model, xs = recurrent_inputs(3)
    tl.record(model, xs, save=["cell"], to=tmp_path, progress=True)
    err = capsys.readouterr().err
    assert "tl.record" in err and "rows" in err and "MB" in err
    tl.record(model, xs, save=["cell"], to=tmp_path / "quiet", progress=False)
    assert capsys.readouterr().err == ""


def test_a_shard_whose_manifest_cannot_be_written_is_taken_back(tmp_path, monkeypatch):
    """The disk fills between a shard and the manifest that would list it: the shard goes too,
    so every shard file is one the manifest lists, and the same call resumes."""
    from torchlens.recording import writer
    from torchlens.recording.manifest import RecordingError

    model, xs = recurrent_inputs(6)
    reference = tl.record(model, xs, save=["cell"], to=tmp_path / "ref", shard_bytes=1,
                          progress=False)
    real = writer.write_json

    def full_at_the_third_shard(path, data):
        if len(data.get("shards", ())) == 3:
            raise RecordingError("could not write: No space left on device",
                                 code="recording_write_failed", teach=[])
        real(path, data)

    monkeypatch.setattr(writer, "write_json", full_at_the_third_shard)
    with pytest.raises(tl.TorchLensError) as err:
        tl.record(model, xs, save=["cell"], to=tmp_path / "acts", shard_bytes=1, progress=False)
    assert err.value.code == "recording_write_failed"
    partial = tl.recording.open(tmp_path / "acts")
    assert sorted(p.name for p in (tmp_path / "acts" / "shards").iterdir()) == sorted(
        s["file"].rpartition("/")[2] for s in partial.manifest["shards"])
    assert len(partial.manifest["shards"]) == 2
    monkeypatch.setattr(writer, "write_json", real)
    rec = tl.record(model, xs, save=["cell"], to=tmp_path / "acts", shard_bytes=1,
                    progress=False)
    assert rec.complete and torch.equal(rec["cell"][0:12], reference["cell"][0:12])
