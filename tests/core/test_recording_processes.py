"""The store across real processes: a run killed with SIGKILL, and torchrun with two ranks."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import torch

import torchlens as tl
from tests.core.scripts.record_worker import build
from tests.launch import ROOT, child_env

WORKER = ["-m", "tests.core.scripts.record_worker"]


def _rows(rec) -> dict[str, torch.Tensor]:
    return {label: rec[label][0:len(rec)] for label in rec.labels}


def _torchrun(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=240)


def test_a_store_killed_at_any_moment_opens_and_resumes(tmp_path):
    n = 16
    model, inputs = build(n)
    reference = tl.record(model, inputs, save=["a", "relu_1"], to=tmp_path / "ref",
                          shard_bytes=1, progress=False)
    want = _rows(reference)
    store = tmp_path / "acts"
    cmd = [sys.executable, *WORKER, "--to", str(store), "-n", str(n), "--delay", "0.05"]
    kills = 0
    for delay in (0.0, 0.013, 0.031):
        proc = subprocess.Popen(cmd, cwd=ROOT, env=child_env())
        deadline = time.monotonic() + 60
        before = len(tl.recording.open(store)) if (store / "manifest.json").exists() else 0
        while time.monotonic() < deadline and proc.poll() is None:
            if (store / "manifest.json").exists() and len(tl.recording.open(store)) > before:
                break
            time.sleep(0.005)
        time.sleep(delay)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait(timeout=30)
        rec = tl.recording.open(store)  # whatever the moment, it opens
        got = _rows(rec)
        assert 0 < len(rec) < reference.manifest["rows"] + 1
        for label in want:  # every completed row is the right row
            assert torch.equal(got[label], want[label][:len(rec)])
    assert kills >= 2
    subprocess.run(cmd[:-2], cwd=ROOT, env=child_env(), check=True, timeout=120)  # resume, no delay
    final = tl.recording.open(store)
    assert final.complete and all(torch.equal(v, want[k]) for k, v in _rows(final).items())


def test_a_real_write_error_is_typed_and_leaves_the_store_consistent(tmp_path):
    """The operating system refuses every write from the fourth forward on (a file size limit,
    as a full disk would): the run ends with recording_write_failed naming the cause, the store
    opens with the whole inputs written before, no temporary file is left, and the same call
    resumes to the complete store."""
    n = 8
    model, inputs = build(n)
    reference = _rows(tl.record(model, inputs, save=["a", "relu_1"], to=tmp_path / "ref",
                                shard_bytes=1, progress=False))
    store = tmp_path / "acts"
    cmd = [sys.executable, *WORKER, "--to", str(store), "-n", str(n)]
    # forward 1 checks the labels; inputs 0 and 1 are recorded before the limit
    failed = subprocess.run([*cmd, "--file-limit-after", "4"], cwd=ROOT, env=child_env(),
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 3, failed.stderr[-3000:]
    assert failed.stdout.startswith("recording_write_failed") and "too large" in failed.stdout
    rec = tl.recording.open(store)
    assert not rec.complete and len(rec) in (1, 1 + 2)  # input 0 has 1 row, input 1 has 2
    for label, rows in _rows(rec).items():
        assert torch.equal(rows, reference[label][:len(rec)])
    assert [p.name for p in (store / "shards").iterdir()] == [
        s["file"].rpartition("/")[2] for s in rec.manifest["shards"]]
    subprocess.run(cmd, cwd=ROOT, env=child_env(), check=True, timeout=120)
    final = tl.recording.open(store)
    assert final.complete and all(torch.equal(v, reference[k]) for k, v in _rows(final).items())


def test_torchrun_with_two_ranks_writes_the_single_process_store_bit_for_bit(tmp_path):
    n = 11  # not a multiple of 2: the ranks hold 6 and 5 inputs
    model, inputs = build(n)
    single = tl.record(model, inputs, save=["a", "relu_1"], to=tmp_path / "one",
                       shard_bytes=1, progress=False)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", *WORKER, "--to", str(tmp_path / "two"), "-n", str(n)]
    # rank 1 dies on its fourth forward: the label check, then inputs 1 and 3 recorded
    failed = _torchrun([*cmd, "--fail-rank", "1", "--fail-after", "3"])
    assert failed.returncode != 0
    partial = tl.recording.open(tmp_path / "two")
    assert [r["items"] for r in partial.manifest["ranks"]] == [6, 2] and not partial.complete
    done = _torchrun(cmd)  # the same command again: each rank resumes its own share
    assert done.returncode == 0, done.stderr[-3000:]
    two = tl.recording.open(tmp_path / "two")
    assert two.manifest["world_size"] == 2 and two.complete
    assert {s["rank"] for s in two.manifest["shards"]} == {0, 1}
    assert [r["items"] for r in two.manifest["ranks"]] == [6, 5]
    assert len(two) == len(single) and two.labels == single.labels
    for label in single.labels:
        a, b = single[label][0:len(single)], two[label][0:len(two)]
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    shuffled = [torch.cat(list(r.batches("a", batch_size=7, shuffle=True, seed=1)))
                for r in (single, two)]
    assert torch.equal(*shuffled)


def test_torchrun_with_a_distributed_sampler_keeps_the_dataset_order(tmp_path):
    from tests.core.scripts.record_worker import loader

    model, _ = build(1)
    single = tl.record(model, loader(12, distributed=False), save=["a"], to=tmp_path / "one",
                       progress=False)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", *WORKER, "--to", str(tmp_path / "two"), "-n", "12", "--loader"]
    done = _torchrun(cmd)
    assert done.returncode == 0, done.stderr[-3000:]
    two = tl.recording.open(tmp_path / "two")
    assert two.manifest["interleave"] == "rows" and len(two) == len(single) == 12
    assert torch.equal(two["a"][0:12], single["a"][0:12])


def test_torchrun_records_compiled_as_one_store(tmp_path):
    n = 7
    model, inputs = build(n)
    single = tl.record(model, inputs, save=["a", "relu_1"], to=tmp_path / "one",
                       progress=False)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", *WORKER, "--to", str(tmp_path / "two"), "-n", str(n),
           "--compile"]
    done = _torchrun(cmd)
    assert done.returncode == 0, done.stderr[-3000:]
    two = tl.recording.open(tmp_path / "two")
    assert two.complete and [r["items"] for r in two.manifest["ranks"]] == [4, 3]
    assert two.manifest["options"]["compile"]["backend"] == "inductor"
    assert two.manifest["compiled"]["recompiles"] <= 2  # batches of 1, 2 and 3 rows
    for label in single.labels:
        a, b = single[label][0:len(single)], two[label][0:len(two)]
        assert torch.allclose(a, b, atol=1e-6), label
