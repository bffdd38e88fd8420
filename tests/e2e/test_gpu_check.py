"""The GPU check (``benchmarks/gpu_check.py``) runs as it is on the CPU, so a session lent a GPU
spends its device time on the checks, not on the harness; its checks can fail."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_check  # noqa: E402
from _common import TinyOps  # noqa: E402

import torchlens as tl  # noqa: E402


def test_the_gpu_check_runs_every_check_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    rc = gpu_check.main(["--device", "cpu", "--models", "tinyops", "--runs", "1",
                         "--json", str(out)])
    report = json.loads(out.read_text())
    entry = report["models"]["tinyops"]
    assert rc == 0 and report["ok"]
    # 902 nodes (input, 900 ops, output), each value saved, and the trace's output
    assert entry["identity"] == {**entry["identity"], "ops": 902, "values": 903, "ok": True,
                                 "differences": 0}
    assert entry["surfaces"] == {"ok": True, "failed": []}
    assert report["rng"] == {"ok": True, "forward_draws": True, "summary_kept": True}
    assert entry["syncs"]["note"] == "n/a: not on CUDA"
    assert report["per_op"]["tinyops"]["ops"] == 900
    assert set(report["ratios"]["tl_meta"]) == {"tinyops"}
    assert {t["method"] for t in report["targets"]} == {"tl_meta", "tl_all", "tl_record"}


def test_the_identity_check_finds_a_different_graph_and_different_values():
    torch.manual_seed(0)
    model, x = TinyOps(3).eval(), torch.randn(1, 8)
    shorter = TinyOps(2).eval()
    found = gpu_check.check_identity(tl, model, x, shorter, x)
    assert not found["ok"] and any("only in cpu" in line for line in found["shown"])
    moved = TinyOps(3).eval()  # the same graph, other weights
    found = gpu_check.check_identity(tl, model, x, moved, x)
    assert not found["ok"] and all("values differ" in line for line in found["shown"])


def test_a_sync_per_capture_fails_a_trace_and_a_few_pass_a_pinned_surface():
    counts = {"plain": 2, "tl.trace(save=None)": 2, 'tl.trace(save="all")': 3,
              "tl.summary": 2 + gpu_check.PINNED_SYNCS, "tl.draw: capture": 3}
    verdict = gpu_check.sync_verdict(counts)
    assert not verdict["ok"] and verdict["failed"] == {'tl.trace(save="all")': 1}
    counts['tl.trace(save="all")'] = 2
    assert gpu_check.sync_verdict(counts)["ok"]
    counts["tl.summary"] += 1
    assert gpu_check.sync_verdict(counts)["failed"] == {"tl.summary": gpu_check.PINNED_SYNCS + 1}


def test_values_are_equal_only_with_the_same_tensors_in_the_same_nesting():
    a = torch.arange(6.0).reshape(2, 3)
    assert gpu_check.equal((a, a[0]), (a.clone(), a[0].clone()))
    assert not gpu_check.equal((a, a[0]), (a, a[1]))
    assert not gpu_check.equal(a, (a, a))
    assert not gpu_check.equal(a, a.double())


def test_the_rng_check_fails_when_the_summary_leaves_the_generator_moved(monkeypatch):
    from torchlens.capture import policy

    monkeypatch.setattr(policy.torch.random, "fork_rng", lambda **k: contextlib.nullcontext())
    found = gpu_check.check_rng(tl, torch.device("cpu"))
    assert found == {"ok": False, "forward_draws": True, "summary_kept": False}


def test_a_check_that_raises_fails_the_run_and_the_others_still_report(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(gpu_check, "check_surfaces", broken)
    out = tmp_path / "gpu.json"
    rc = gpu_check.main(["--device", "cpu", "--models", "tinyops", "--runs", "1",
                         "--json", str(out)])
    entry = json.loads(out.read_text())["models"]["tinyops"]
    assert rc == 1
    assert not entry["surfaces"]["ok"] and "RuntimeError: no such kernel" in entry["surfaces"][
        "error"]
    assert entry["identity"]["ok"] and entry["timing"]["ok"]
