"""Ops inside functorch transforms: ``torch.vmap`` in a forward records the real tensors, with
edges into and out of the transform, and validation replays them under vmap."""

from __future__ import annotations

import torch
from torch import nn

import torchlens as tl
from torchlens.validation import validate_backward_pass, validate_forward_pass


class Vmapped(nn.Module):
    """vmap with moved in/out dims, nested, chunked with an in-place write inside."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.w = nn.Parameter(torch.randn(4, 6))

    def forward(self, x):
        h = self.fc(x)  # [3, 4]
        z = torch.vmap(lambda r: r.sin() @ self.w, in_dims=1, out_dims=1)(h.t())  # [6, 3]
        outer = torch.vmap(torch.vmap(lambda a, b: a * b, in_dims=(None, 0)),
                           in_dims=(0, None))(z.sum(0), h[0])  # [3, 4]

        def bump(r):
            u = r * 3
            u.add_(1)
            return u.relu()

        return z.sum() + outer + torch.vmap(bump, chunk_size=2)(h)


def _ops(trace, name):
    return [op for op in trace if op.kind == "op" and op.func == name]


def test_ops_inside_vmap_record_the_real_tensors_connected_to_the_forward():
    torch.manual_seed(0)
    model, x = Vmapped(), torch.randn(3, 4)
    trace = tl.trace(model, x)
    assert torch.equal(trace.output, model(x))
    h = trace["linear_1"].out

    # the batch of examples is the front dimension, whatever in_dims said
    (sin,) = _ops(trace, "sin")
    assert sin.shape == [3, 4] and sin.parents == ["t_1"]
    torch.testing.assert_close(sin.out, h.sin())
    (matmul,) = _ops(trace, "matmul")
    assert matmul.shape == [3, 6] and matmul.parents == ["sin_1"]
    assert matmul.flops == 2 * 3 * 4 * 6  # the whole batch's work, not one example's
    torch.testing.assert_close(matmul.out, h.sin() @ model.w)
    # what vmap returned (a view with the batch moved to dim 1) is matmul's output
    (first_sum,) = [op for op in _ops(trace, "sum") if op.shape == [3]]
    assert first_sum.parents == ["matmul_1"]

    # nested: the outer level's dimension first, then the inner one's
    (outer,) = [op for op in _ops(trace, "mul") if op.parents == ["sum_1", "getitem_1"]]
    assert outer.shape == [3, 4]
    torch.testing.assert_close(outer.out, first_sum.out[:, None] * h[0][None, :])

    # chunked, with an in-place write on a tensor made inside the transform
    adds = _ops(trace, "add_")
    assert [op.shape for op in adds] == [[2, 4], [1, 4]] and all(op.inplace for op in adds)
    relus = _ops(trace, "relu")
    assert [op.parents for op in relus] == [[op.label] for op in adds]
    (cat,) = _ops(trace, "cat")
    assert cat.parents == [op.label for op in relus]
    torch.testing.assert_close(cat.out, (h * 3 + 1).relu())

    # every op is connected: nothing but the input starts a path, nothing but the output ends one
    ops = [op for op in trace if op.kind == "op"]
    assert all(op.parents for op in ops) and all(op.children for op in ops)


def test_ops_inside_vmap_validate_forward_and_backward_and_record_by_label():
    torch.manual_seed(0)
    model, x = Vmapped(), torch.randn(3, 4)
    forward = validate_forward_pass(model, x)
    assert forward.passed and not [r for r in forward.rows if r["status"] != "passed"]
    assert validate_backward_pass(model, x).passed
    trace = tl.trace(model, x)
    recording = tl.record(model, x, save=["sin_1", "matmul_1", "relu_2"], progress=False)
    for label in ("sin_1", "matmul_1", "relu_2"):
        torch.testing.assert_close(recording[label], trace[label].out)


class FuncGrad(nn.Module):
    """``torch.func.grad`` inside a forward (a force from an energy, say)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x) + torch.func.grad(lambda a: (a * a).sum())(x[0])


def test_func_grad_inside_a_forward_is_connected_and_its_grad_call_not_replayed():
    model, x = FuncGrad(), torch.randn(5, 4)
    trace = tl.trace(model, x)
    (grad,) = _ops(trace, "grad")
    torch.testing.assert_close(grad.out, 2 * x[0])
    assert "grad_1" in trace["add_1"].parents
    assert trace["requires_grad__1"].parents == ["getitem_1"]
    report = validate_forward_pass(model, x)
    (skipped,) = [r for r in report.rows if r["status"] == "skipped"]
    assert skipped["label"] == "grad_1" and "autograd graph" in skipped["reason"]
    assert not report.failed


class Ensemble(nn.Module):
    """Three members run as one under vmap, from their stacked parameters (torch.func's
    ensembling recipe)."""

    def __init__(self):
        super().__init__()
        self.members = nn.ModuleList(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
                                     for _ in range(3))

    def forward(self, x):
        params, buffers = torch.func.stack_module_state(list(self.members))
        return torch.vmap(lambda p, b, x: torch.func.functional_call(self.members[0], (p, b), x),
                          in_dims=(0, 0, None))(params, buffers, x)


def test_an_ensemble_under_vmap_counts_every_members_flops_in_its_module_calls():
    torch.manual_seed(0)
    model, x = Ensemble(), torch.randn(5, 4)
    trace = tl.trace(model, x)
    torch.testing.assert_close(trace.output, torch.stack([m(x) for m in model.members]))
    first, second = _ops(trace, "linear")
    assert (first.shape, first.module) == ([3, 5, 8], "members.0.0")
    assert first.flops == 3 * 2 * 5 * 4 * 8 and second.flops == 3 * 2 * 5 * 8 * 2
    assert first.parents[0] == "input_1" and second.parents[0] == "relu_1"
    assert validate_backward_pass(model, x).passed


class WritesThroughVmap(nn.Module):
    def forward(self, x):
        h = x.clone()
        torch.vmap(lambda r: r.mul_(2))(h)  # writes h itself, example by example
        return h + 1


def test_a_write_through_a_vmapped_argument_keeps_the_saved_value_it_overwrites():
    x = torch.randn(3, 4)
    trace = tl.trace(WritesThroughVmap(), x)
    assert torch.equal(trace["clone_1"].out, x)  # copied before the write, not after
    assert trace["mul__1"].inplace and trace["mul__1"].parents == ["clone_1"]
    assert torch.equal(trace["mul__1"].out, 2 * x)
    assert trace["add_1"].parents == ["mul__1"]
    assert torch.equal(trace.output, 2 * x + 1)


class Noisy(nn.Module):
    def forward(self, x):
        return torch.vmap(lambda r: torch.rand(4), randomness="different")(x) + x


def test_a_random_op_first_inside_vmap_is_batched_and_its_trace_saves(tmp_path):
    trace = tl.trace(Noisy(), torch.randn(3, 4))
    assert trace["rand_1"].shape == [3, 4] and trace["add_1"].parents == ["rand_1", "input_1"]
    trace.save(tmp_path / "noisy.tlens")
    assert torch.equal(tl.load(tmp_path / "noisy.tlens")["rand_1"].out, trace["rand_1"].out)


class Jacobians(nn.Module):
    """jacrev (autograd.grad under vmap), jacfwd (dual numbers under vmap) and vmap(grad)."""

    def __init__(self):
        super().__init__()
        self.f, self.g = nn.Linear(3, 3), nn.Linear(9, 2)

    def forward(self, x):
        rev = torch.func.jacrev(lambda v: torch.tanh(self.f(v)))(x[0])
        fwd = torch.func.jacfwd(lambda v: torch.sin(v) * 2)(x[1])
        per_row = torch.func.vmap(torch.func.grad(lambda v: (v ** 3).sum()))(x)
        return self.g((rev + fwd + per_row.sum()).reshape(1, 9))


def test_jacobians_in_a_forward_validate_what_a_replay_can_and_say_what_it_cannot():
    torch.manual_seed(0)
    model, x = Jacobians(), torch.randn(2, 3)
    trace = tl.trace(model, x)
    torch.testing.assert_close(trace.output, model(x))
    forward = validate_forward_pass(model, x)
    assert not forward.failed
    skipped = {r["label"]: r["reason"] for r in forward.rows if r["status"] == "skipped"}
    assert {"grad_1", "make_dual_1", "unpack_dual_1", "grad_2"} <= skipped.keys()
    assert "dual" in skipped["make_dual_1"] and "autograd graph" in skipped["grad_1"]
    backward = validate_backward_pass(model, x)
    assert not backward.failed
    cut = {r["label"]: r["reason"] for r in backward.rows if r["status"] == "skipped"}
    assert cut and all("passes through grad_" in reason for reason in cut.values())


class ItemWriteInVmap(nn.Module):
    """An item assignment inside vmap (FlexAttention's block mask is built so)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        def swap(row):
            out = row.clone()
            out[0] = row[1] * 2
            return out

        return torch.vmap(swap)(self.fc(x))


def test_an_item_assignment_inside_vmap_is_replayed_under_vmap():
    torch.manual_seed(0)
    model, x = ItemWriteInVmap(), torch.randn(4, 3)
    trace = tl.trace(model, x)
    assert trace["setitem_1"].shape == [4, 3] and trace["setitem_1"].parents == [
        "clone_1", "mul_1"]
    assert torch.equal(trace["setitem_1"].out, model(x))
    forward, backward = validate_forward_pass(model, x), validate_backward_pass(model, x)
    assert forward.passed and backward.passed
    assert {row["label"]: row["status"] for row in forward.rows}["setitem_1"] == "passed"
