"""Models dispatched by accelerate: weights offloaded to cpu or disk, brought in per module by
its hooks. Every surface sees the same model as without offloading (issue 15)."""

from __future__ import annotations

import re

import pytest
import torch

import torchlens as tl

ROW_KEYS = ("layer", "type", "output_shape", "params", "recursive_params", "flops")


def offloaded(kind: str, folder, tmp_path):
    from accelerate import cpu_offload, disk_offload
    from transformers import AutoModelForCausalLM

    if kind == "device_map":  # transformers' own loader: some blocks on cpu, some on disk
        device_map = {"transformer.wte": "cpu", "transformer.wpe": "cpu",
                      "transformer.drop": "cpu", "transformer.h": "disk",
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
    # the tied lm_head weight is one parameter, as in the plain model, though offloading gave
    # each module its own placeholder (cpu/disk_offload) or kept the tie (device_map)
    assert [(op.func, op.module, op.params) for op in log] == [
        (op.func, op.module, op.params) for op in ref]  # no hook bookkeeping among the ops
    assert torch.allclose(log.output["logits"], want, atol=1e-5)
    assert torch.allclose(log[-2].out, ref[-2].out, atol=1e-5)
    homes = {name: info.get("home") for name, info in log.params.items()}
    expected = "offloaded: cpu" if kind == "cpu_offload" else "offloaded: disk"
    assert expected in homes.values()
    summary = tl.summary(model, {"input_ids": ids})
    real = tl.summary(plain, {"input_ids": ids})
    measured = ("time_ms",)
    assert {k: v for k, v in summary.totals.items() if k not in measured} == {
        k: v for k, v in real.totals.items() if k not in measured}
    assert [{k: r[k] for k in ROW_KEYS} for r in summary.rows] == [
        {k: r[k] for k in ROW_KEYS} for r in real.rows]
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


def _gpt2(folder, tie: bool):
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=500, n_positions=64, n_embd=64, n_layer=2,
                                           n_head=2, tie_word_embeddings=tie)).eval()
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("kind", ["cpu_offload", "disk_offload", "device_map"])
def test_a_tied_weight_is_counted_once_under_offloading(kind, tmp_path):
    """The issue's model: GPT-2 (2 layers, width 64, vocab 500) whose lm_head shares wte's
    weight: every count (summary, trace.params, module counts, the drawing, a store's
    fingerprint) equals the plain model's."""
    from torchlens.recording.manifest import fingerprint

    plain = _gpt2(tmp_path / "gpt2", tie=True)
    model = offloaded(kind, tmp_path / "gpt2", tmp_path)
    x = torch.randint(0, 500, (1, 8))
    want = sum(p.numel() for p in plain.parameters())
    assert want == 136_192
    summary = tl.summary(model, x)
    assert summary.totals["total_params"] == want
    assert summary.totals["shared_params"] == 1
    assert f"Total params: {want:,} (shared counted once)" in str(summary)
    log, ref = tl.trace(model, x), tl.trace(plain, x)
    assert log.num_params == want
    assert log.params["transformer.wte.weight"]["aliases"] == ["lm_head.weight"]
    assert "lm_head.weight" not in log.params
    assert {m: log.modules[m].num_params for m in log.modules} == {
        m: ref.modules[m].num_params for m in ref.modules}
    assert fingerprint(model)["parameters"] == want
    tl.draw(model, x, path=tmp_path / "tied.svg", file_format="svg")
    tl.draw(plain, x, path=tmp_path / "plain.svg", file_format="svg")
    counts = [re.findall(r"[\d,.]+[KM]? params", (tmp_path / f"{n}.svg").read_text())
              for n in ("tied", "plain")]
    assert counts[0] == counts[1] and counts[0]


def test_a_declared_tie_is_not_applied_to_weights_the_config_unties(tmp_path):
    """tie_word_embeddings=False: lm_head and wte are two weights; offloaded, still two."""
    from accelerate import disk_offload

    plain = _gpt2(tmp_path / "untied", tie=False)
    want = sum(p.numel() for p in plain.parameters())
    model = disk_offload(_gpt2(tmp_path / "untied2", tie=False), str(tmp_path / "off"),
                         execution_device="cpu")
    x = torch.randint(0, 500, (1, 8))
    assert tl.summary(model, x).totals["total_params"] == want == 136_192 + 32_000


class TiedPair(torch.nn.Module):
    """Not a transformers model: an encoder and a decoder sharing one weight."""

    def __init__(self):
        super().__init__()
        self.enc, self.dec = torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False)
        self.dec.weight = self.enc.weight

    def forward(self, x):
        return self.dec(torch.relu(self.enc(x)))


def test_any_library_declares_its_ties_through_torchlens_tied_parameters(register_plugin,
                                                                         tmp_path):
    """disk_offload writes one file per name: without a declaration the tie cannot be seen
    (counted per name); a plugin implementing the hook makes it count once again."""
    from accelerate import disk_offload

    x = torch.randn(2, 4)
    model = disk_offload(TiedPair().eval(), str(tmp_path / "off"), execution_device="cpu")
    assert tl.summary(model, x).totals["total_params"] == 32  # nothing says they are one

    class Declares:
        @tl.hookimpl
        def torchlens_tied_parameters(self, model):
            return {"dec.weight": "enc.weight"} if isinstance(model, TiedPair) else None

    register_plugin(Declares())
    summary = tl.summary(model, x)
    assert summary.totals["total_params"] == 16 and summary.totals["shared_params"] == 1
    assert tl.trace(model, x)["linear_2"].params == ["enc.weight"]
