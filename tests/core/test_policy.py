"""The execution policy: pinned surfaces restore and verify; tl.trace keeps the caller's modes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

import torchlens as tl
from torchlens.capture.policy import pinned, state_hash


class TrainNet(nn.Module):
    def __init__(self, fail: bool = False):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)
        self.fail = fail

    def forward(self, x):
        h = self.drop(self.bn(self.fc(x)))
        if self.fail:
            raise RuntimeError("boom")
        return h


def _buffers(model):
    return {k: v.clone() for k, v in model.named_buffers()}


def _same_buffers(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("fail", [False, True])
def test_summary_restores_train_mode_buffers_and_rng(fail):
    torch.manual_seed(0)
    model = TrainNet(fail).train()
    model.drop.eval()  # a mixed-mode model comes back mixed
    x = torch.rand(3, 4)
    buffers, rng, h0 = _buffers(model), torch.get_rng_state(), state_hash(model)
    if fail:
        with pytest.raises(RuntimeError):
            tl.summary(model, x)
    else:
        s = tl.summary(model, x)
        assert s.receipt.verified and s.receipt.hash_before == s.receipt.hash_after
        assert s.receipt.pinned["mode"] == "eval" and "rng state" in s.receipt.restored
    assert model.training and model.fc.training and model.bn.training
    assert not model.drop.training
    assert _same_buffers(buffers, _buffers(model))
    assert torch.equal(rng, torch.get_rng_state())
    assert state_hash(model) == h0


def test_pinned_runs_eval_and_no_grad():
    model = TrainNet().train()
    seen = {}

    def hook(module, args, out):
        seen["training"] = module.training
        seen["grad"] = torch.is_grad_enabled()

    model.bn.register_forward_hook(hook)
    tl.summary(model, torch.rand(3, 4))
    assert seen == {"training": False, "grad": False}


def test_state_restore_failed_on_a_parameter_write():
    class Writes(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        def forward(self, x):
            self.w.data.add_(1.0)
            return x * self.w

    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(Writes(), torch.rand(2))
    assert err.value.code == "state_restore_failed"


def test_trace_keeps_train_mode_and_really_updates_batchnorm():
    model = TrainNet().train()
    before = model.bn.running_mean.clone()
    tl.trace(model, torch.rand(8, 4) + 3.0)
    assert model.training
    assert not torch.equal(before, model.bn.running_mean)
    assert model.bn.num_batches_tracked.item() == 1


def test_batchnorm_warning_once_per_process_names_eval():
    code = (
        "import warnings, torch, torchlens as tl\n"
        "from torch import nn\n"
        "m = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).train()\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    tl.trace(m, torch.rand(4, 3)); tl.trace(m, torch.rand(4, 3))\n"
        "    tl.trace(nn.Sequential(nn.BatchNorm1d(3)).train(), torch.rand(4, 3))\n"
        "codes = [x.message.code for x in w if hasattr(x.message, 'code')]\n"
        "print(codes.count('batchnorm_train_stats_mutated'))\n"
        "print(str(w[0].message))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = out.stdout.splitlines()
    assert lines[0] == "1", out.stderr
    assert lines[1].startswith("batchnorm_train_stats_mutated") and "model.eval()" in lines[1]


def test_eval_trace_does_not_warn():
    import warnings

    model = TrainNet().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tl.trace(model, torch.rand(2, 4))


def test_pinned_context_reports_receipt_even_on_error():
    model = TrainNet().train()
    with pytest.raises(ValueError), pinned(model, "test") as box:
        raise ValueError("x")
    assert box["receipt"].verified and model.training


def test_pinned_surfaces_compile_nothing_of_a_compiled_model():
    """The pinned policy runs compiled code eagerly: ``tl.summary``'s warm-up forward and
    capture and ``guess_input_shape``'s probes leave no compiled graph (each would otherwise
    compile, and every probed shape recompile), and the stance is back after."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU()).eval()
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(2, 8)
    rows = tl.summary(compiled, x).rows
    assert [row["layer"] for row in rows] == ["_orig_mod", "_orig_mod.0", "_orig_mod.1"]
    assert tl.debug.guess_input_shape(compiled).input_shape[-1] == 8
    assert not counters["stats"]["unique_graphs"]
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
    assert counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()



class _FirstCallInit(nn.Module):
    """A first call that differs (data-dependent initialization, ActNorm-style): guarded by a
    buffer, it takes another path than later calls and, when ``write``, sets ``loc`` through
    ``.data``."""

    def __init__(self, write: bool):
        super().__init__()
        self.write = write
        self.loc = nn.Parameter(torch.zeros(4))
        self.head = nn.Linear(4, 2)
        self.register_buffer("initialized", torch.zeros((), dtype=torch.bool))

    def forward(self, x):
        if not self.initialized:
            self.initialized.fill_(True)
            if self.write:
                self.loc.data.copy_(-x.mean(0))
            return torch.tanh(x + self.loc)
        return self.head(x + self.loc)


def test_summary_undoes_its_warm_up_before_the_capture():
    """The warm-up forward's buffer writes are put back before the capture, so the first
    summary (with a warm-up) and the second (without) both describe the caller's next call."""
    model, x = _FirstCallInit(write=False), torch.randn(3, 4)
    first, second = tl.summary(model, x), tl.summary(model, x)
    assert first.trace.meta["timing"]["warmup_forwards"] == 1
    assert second.trace.meta["timing"]["warmup_forwards"] == 0
    for summary in (first, second):
        assert [op.func for op in summary.trace if op.kind == "op"] == ["fill_", "add", "tanh"]
        assert summary.receipt.verified and summary.receipt.restored_buffers == ["initialized"]
    assert not model.initialized


def test_summary_catches_a_parameter_write_its_warm_up_made():
    """A parameter written through ``.data`` on the first call fails the receipt, by name,
    though the uncaptured warm-up forward made the write first."""
    model, x = _FirstCallInit(write=True), torch.randn(3, 4)
    with pytest.raises(tl.TorchLensError) as err:
        tl.summary(model, x)
    assert err.value.code == "state_restore_failed" and "['loc']" in str(err.value)
    assert not model.initialized


def test_a_forward_that_flips_requires_grad_is_restored_and_named():
    class Freezing(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            self.fc.weight.requires_grad_(False)
            return self.fc(x)

    model = Freezing()
    receipt = tl.summary(model, torch.randn(2, 4)).receipt
    assert model.fc.weight.requires_grad and model.fc.bias.requires_grad
    assert receipt.verified and receipt.restored_requires_grad == ["fc.weight"]
    assert "requires_grad" in receipt.undone


def test_hooks_a_forward_registers_or_removes_are_put_back_and_named():
    """A forward that registers a forward hook, and a one-shot pre-hook that removes itself:
    after the summary the hook tables are as they were, also between the warm-up and the
    capture (each forward ran with exactly one forward hook)."""

    class Hooking(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.seen = nn.Linear(4, 4), []
            self.once = self.fc.register_forward_pre_hook(lambda m, a: self.once.remove())

        def forward(self, x):
            self.fc.register_forward_hook(lambda m, a, o: self.seen.append(o.shape))
            return self.fc(x)

    model = Hooking()
    pre_hooks = dict(model.fc._forward_pre_hooks)
    receipt = tl.summary(model, torch.randn(2, 4)).receipt
    assert dict(model.fc._forward_pre_hooks) == pre_hooks and not model.fc._forward_hooks
    assert len(model.seen) == 2  # the warm-up's hook and the capture's, one each
    assert receipt.verified and receipt.restored_hooks == ["fc"] and "hooks" in receipt.undone


def test_two_threads_summarizing_one_model_leave_it_as_it_was():
    """Pinned blocks on one model run one at a time: overlapping ones restored each other's
    snapshots, leaving the model in eval mode and a buffer written."""
    import threading
    import time

    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls += 1
            time.sleep(0.002)  # a forward long enough for the other thread to start its own
            return self.fc(x)

    model, x = Counting().train(), torch.randn(3, 4)
    errors: list[BaseException] = []

    def run():
        for _ in range(6):
            try:
                assert tl.summary(model, x).receipt.verified
            except BaseException as exc:  # noqa: BLE001  (reported below)
                errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert model.training and model.fc.training and model.calls.item() == 0
