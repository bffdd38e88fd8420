"""Models sharded across two processes (issue 60): torchrun, gloo, CPU, each value checked
against the unsharded model of the same seed (``sharded_checks``). One torchrun per group of
checks, under a timeout, so a hang fails instead of waiting."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import torchlens as tl
from tests.distributed.sharded_checks import MLP
from tests.launch import ROOT, child_env


def _torchrun(folder, group: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "tests.distributed.sharded_checks", str(folder), group]
    done = subprocess.run(cmd, cwd=ROOT, env=child_env(), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((folder / f"{group}.rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        assert "crash" not in rank, rank["crash"]
    return ranks


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sharded")
    return folder, _torchrun(folder, "models")


def _whole(result: dict, ops: int) -> None:
    assert result["labels"] and result["shapes"] and result["values_differ"] == []
    assert result["ops"] == ops and result["params"] == result["ref_params"]


def test_tensor_parallel_values_read_whole_on_every_rank(models):
    _, ranks = models
    for rank in ranks:
        tp = rank["tp"]
        _whole(tp, 5)  # input, linear, relu, linear, output: no view_as, no wrapper
        _whole(tp["no_grad"], 5)
        assert tp["collectives"] == ["all_reduce_1"] and tp["params"] == 552
        assert tp["local"] == ["DTensor", ["Shard(dim=1)"], [4, 16], [2]]
        assert tp["meta"] == {"placement": ["Shard(dim=1)"], "mesh": [2], "local_shape": [4, 16]}
        assert tp["module_out"] == ["linear_1"] and tp["grads_differ"] == []
        row = next(line for line in tp["summary"].splitlines() if line.startswith("up "))
        assert "4×32 Shard(dim=1)" in row and "288" in row


def test_edits_address_the_whole_tensor(models):
    _, ranks = models
    for rank in ranks:
        assert set(rank["edits"]) == {"patch_from_a_sharded_trace", "mean_of_a_sharded_batch",
                                      "scale_module_index", "zero_module_index",
                                      "zero_op_across_shards", "replace_module",
                                      "add_partial_sum", "add_module_after_reduce"}
        for name, got in rank["edits"].items():
            assert got["output"] and got["site_value"] and got["model_restored"], name
            assert got["norm"][0] == pytest.approx(got["norm"][1], rel=1e-5), name


def test_a_rank_0_trace_file_loads_without_torch_distributed(models):
    folder, _ = models
    loaded = tl.load(folder / "tp.trace")  # this process has no process group
    torch.manual_seed(0)
    ref = MLP()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    want = tl.trace(ref, x)
    ops = [op for op in loaded.ops if "communication" not in op.meta]
    assert [op.label for op in ops] == [op.label for op in want.ops]
    for op, ref_op in zip(ops, want.ops):
        assert type(op.out) is torch.Tensor and torch.allclose(op.out, ref_op.out, atol=1e-5)
    assert loaded["relu_1"].meta["sharded"]["placement"] == ["Shard(dim=1)"]


def test_a_llama_sharded_with_the_standard_plan_and_with_tp_plan_auto(models):
    """Values, edits and TransformerLens's names (patterns too) equal the unsharded Llama's."""
    _, ranks = models
    for rank in ranks:
        llama = rank["llama"]
        assert llama["ops"] > 100 and llama["edit"]
        _whole(llama, llama["ops"])
        assert len(llama["collectives"]) == 4  # o_proj and down_proj of 2 layers
        assert llama["names_differ"] == [] and llama["name_edits"] == [True, True]
        auto = rank["llama_auto"]  # transformers' tp_plan="auto"
        _whole(auto, llama["ops"])
        assert auto["sharded"] == "DTensor" and len(auto["collectives"]) == 6  # + embed, head


def test_a_gpt2_style_block_with_separate_qkv_and_an_edit_across_heads(models):
    _, ranks = models
    for rank in ranks:
        block = rank["block"]
        _whole(block, block["ops"])
        assert block["attention"] == [[2, 4, 5, 8], ["Shard(dim=1)"]]  # heads split
        assert block["edit_heads"] and len(block["collectives"]) == 2  # o and proj


def test_fsdp2_forward_and_gradients_read_whole(models):
    _, ranks = models
    for rank in ranks:
        fsdp = rank["fsdp"]
        _whole(fsdp, 5)
        assert fsdp["parents"] and fsdp["advisories"] == [] and fsdp["collectives"] == []
        assert fsdp["grads_differ"] == []


def test_record_writes_one_store_of_whole_rows(tmp_path):
    """Tensor parallel: every rank runs every input, rank 0 writes one store equal to the
    unsharded model's recording (edits, resume and a Llama too); FSDP2: each rank its share,
    forwards in lockstep, one merged store."""
    ranks = _torchrun(tmp_path, "record")
    for rank in ranks:
        tp = rank["tp"]
        assert tp["differ"] == [] and tp["memory"] == [] and tp["edited"] == []
        assert tp["labels"] == ["up", "relu_1", "linear_2"] and tp["world_size"] == 1
        assert "manifest.json" in tp["files"] and not any("rank1" in f for f in tp["files"])
        assert tp["resumed"][1] == []
        refusals = tp["refusals"]
        assert refusals["compile"]["code"] == "record_sharded_unsupported"
        assert refusals["sampler"]["code"] == "record_sharded_unsupported"
        assert refusals["other_inputs"]["code"] == "sharded_ranks_disagree"
        assert refusals["other_store"]["code"] == "recording_mismatch"
        assert rank["llama"] == [] and rank["llama_names"][0] == []  # names, tensor parallel
        assert rank["llama_names"][1] == ["blocks.0.attn.hook_z", "blocks.0.hook_resid_post",
                                          "blocks.1.attn.hook_pattern",
                                          "blocks.1.hook_resid_post"]
        fsdp = rank["fsdp"]
        assert fsdp["differ"] == [] and fsdp["resume"] == [] and fsdp["one_input"] == []
        assert fsdp["rows"] == 15 and fsdp["ranks"] == [3, 2] and fsdp["complete"]
        assert fsdp["sampler"][0] == 6 and fsdp["sampler"][1] < 1e-4  # every row an input's
        assert fsdp["names"]["code"] == "record_sharded_unsupported"  # bound per rank's input
    assert [rank["tp"]["resumed"][0] for rank in ranks] == [2, 2]  # the killed run kept 2


def test_ranks_asked_different_captures_or_failing_refuse_on_every_rank(tmp_path):
    ranks = _torchrun(tmp_path, "failures")
    for rank in ranks:
        assert rank["disagree"]["code"] == "sharded_ranks_disagree"
        assert rank["disagree_save"]["code"] == "sharded_ranks_disagree"
        assert rank["branching"]["code"] == "sharded_ranks_disagree"
        assert rank["compiled"]["code"] == "option_invalid"  # compile= keeps shards: refused
        assert rank["push"]["code"] == "push_sharded_unsupported" and rank["run"]
        assert rank["grad_edits"]["code"] == "option_invalid"
        assert rank["after_disagree"] and rank["after_branching"]
        assert rank["failed_model_kept"]
    assert ranks[1]["failed"] == {"error": "ValueError", "message": "rank 1's forward failed"}
    assert ranks[0]["failed"]["code"] == "sharded_rank_failed"


def test_a_rank_failing_after_the_last_collective_is_no_hang(tmp_path):
    """Rank 0's forward ends well; rank 1's raises after it: rank 0 refuses when the ranks
    compare their forwards, gathering nothing."""
    ranks = _torchrun(tmp_path, "late")
    assert ranks[1]["failed"] == {"error": "ValueError", "message": "rank 1's forward failed"}
    assert ranks[0]["failed"]["code"] == "sharded_rank_failed"
    assert all(rank["failed_model_kept"] for rank in ranks)
