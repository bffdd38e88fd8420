"""Models dispatched by accelerate: weights offloaded to cpu or disk, brought in per module by
its hooks. Every surface sees the same model as without offloading (issue 15)."""

from __future__ import annotations

import pytest
import torch

import torchlens as tl

ROW_KEYS = ("layer", "type", "output_shape", "params", "recursive_params", "flops")


def offloaded(kind: str, folder, tmp_path):
    from accelerate import cpu_offload, disk_offload
    from transformers import AutoModelForCausalLM

    if kind == "device_map":  # transformers' own loader: some blocks on cpu, some on disk
        device_map = {"transformer.wte": "cpu", "transformer.wpe": "cpu",
                      "transformer.drop": "cpu", "transformer.h.0": "disk",
                      "transformer.ln_f": "cpu", "lm_head": "cpu"}
        return AutoModelForCausalLM.from_pretrained(
            folder, device_map=device_map, offload_folder=str(tmp_path / "offload")).eval()
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    if kind == "cpu_offload":
        return cpu_offload(model, execution_device="cpu")
    return disk_offload(model, offload_dir=str(tmp_path / "offload"), execution_device="cpu")


@pytest.mark.parametrize("kind", ["cpu_offload", "disk_offload", "device_map"])
def test_an_offloaded_model_is_captured_like_the_plain_one(kind, gpt2, tmp_path):
    plain = gpt2.model
    model = offloaded(kind, gpt2.path, tmp_path)
    ids = gpt2.tokenizer("the quick brown fox", return_tensors="pt")["input_ids"]
    assert any(p.is_meta for p in model.parameters())  # the weights live elsewhere
    with torch.no_grad():
        want = plain(input_ids=ids).logits
    log = tl.trace(model, {"input_ids": ids})
    ref = tl.trace(plain, {"input_ids": ids})
    untied = model.lm_head.weight is not model.transformer.wte.weight  # cpu/disk_offload untie
    rename = {"lm_head.weight": "transformer.wte.weight"} if untied else {}
    assert [(op.func, op.module, [rename.get(p, p) for p in op.params]) for op in log] == [
        (op.func, op.module, op.params) for op in ref]  # no hook bookkeeping among the ops
    assert torch.allclose(log.output["logits"], want, atol=1e-5)
    assert torch.allclose(log[-2].out, ref[-2].out, atol=1e-5)
    homes = {name: info.get("home") for name, info in log.params.items()}
    expected = "offloaded: cpu" if kind == "cpu_offload" else "offloaded: disk"
    assert expected in homes.values()
    summary = tl.summary(model, {"input_ids": ids})
    real = tl.summary(plain, {"input_ids": ids})
    assert summary.totals["total_params"] == sum(p.numel() for p in model.parameters())
    assert [{k: r[k] for k in ROW_KEYS} for r in summary.rows if not untied or
            r["layer"] not in ("", "lm_head")] == [
        {k: r[k] for k in ROW_KEYS} for r in real.rows if not untied or
        r["layer"] not in ("", "lm_head")]
    receipt = summary.receipt
    assert receipt.verified and receipt.offloaded > 0 and not receipt.no_values
    assert "offloaded tensors are not in the state hash and their bytes were not read" in str(
        summary)
    still = {n: p.device.type for n, p in model.named_parameters()}
    assert "meta" in still.values()  # weights went back where they were
    rec = tl.record(model, [{"input_ids": ids}], save=["transformer.h.0"], progress=False)
    assert torch.allclose(rec["transformer.h.0"], ref["transformer.h.0"].out, atol=1e-5)


EMPTY_SHA256 = "e3b0c44298fc"  # sha256 of nothing: a hash that covers no tensor


@pytest.mark.parametrize("kind,where", [("cpu_offload", "held in CPU memory by accelerate"),
                                        ("disk_offload", "in files on disk"),
                                        ("device_map", "in files on disk")])
def test_an_offloaded_receipt_says_what_it_checked_and_what_not(kind, where, gpt2, tmp_path):
    model = offloaded(kind, gpt2.path, tmp_path)
    ids = gpt2.tokenizer("the quick brown fox", return_tensors="pt")["input_ids"]
    summary = tl.summary(model, {"input_ids": ids})
    line = str(summary).splitlines()[-1]
    r = summary.receipt
    assert r.verified and where in line and "bytes were not read" in line
    assert r.offload_memory + r.offload_files == r.offloaded
    if r.hashed == 0:  # everything offloaded: no hash is shown as if it had checked something
        assert "no resident tensor to hash" in line and EMPTY_SHA256 not in line
    else:  # device_map keeps some blocks resident: those are hashed
        assert f"state hash {r.hash_after[:12]}" in line


class Drift(torch.nn.Linear):
    """A layer whose forward writes its own weight in place, on purpose."""

    def forward(self, x):
        with torch.no_grad():
            self.weight.add_(1.0)
        return super().forward(x)


class Rewrites(torch.nn.Linear):
    """A layer whose forward rewrites the file accelerate offloaded its weight to."""

    path = None

    def forward(self, x):
        with open(self.path, "r+b") as fh:
            fh.write(b"\0" * 16)
        return super().forward(x)


def _pair(first):
    return torch.nn.Sequential(first, torch.nn.Linear(4, 2)).eval()


def test_a_forward_writing_an_offloaded_weight_is_caught(tmp_path):
    from accelerate import cpu_offload, disk_offload

    torch.manual_seed(0)
    x = torch.randn(2, 4)
    kept = cpu_offload(_pair(Drift(4, 4)), execution_device="cpu")  # the write persists
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(kept, x)
    assert err.value.code == "state_restore_failed" and "0.weight" in err.value.message
    # on disk, accelerate loads a fresh copy each call: the write is lost, the files unchanged
    lost = disk_offload(_pair(Drift(4, 4)), str(tmp_path / "a"), execution_device="cpu")
    assert tl.summary(lost, x).receipt.verified
    layer = Rewrites(4, 4)
    rewritten = disk_offload(_pair(layer), str(tmp_path / "b"), execution_device="cpu")
    layer.path = tmp_path / "b" / "0.weight.dat"
    assert layer.path.exists()
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(rewritten, x)
    assert err.value.code == "state_restore_failed" and "0.weight" in err.value.message
