"""The checks of a model sharded across two processes, run under torchrun (gloo, CPU) by
tests/distributed/test_sharded.py: each rank writes what it saw to ``<out>/rank<r>.json``, every
value compared here with the unsharded model built from the same seed.

``python -m torch.distributed.run --nproc-per-node 2 -m tests.distributed.sharded_checks OUT
GROUP``; GROUP ``models`` (tensor parallel MLP and Llama, FSDP2), ``record`` (tl.record of
them: one store of whole rows), ``failures`` (ranks asked different captures, a forward that
branches on the rank, rank 1 failing mid-forward) or ``late`` (rank 1 failing after the
forward's last collective).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import torchlens as tl


class MLP(nn.Module):
    """The issue's model: ``up`` column-parallel, ``down`` row-parallel."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def mlp_pair() -> tuple[nn.Module, nn.Module]:
    """(the unsharded MLP, the same weights sharded by the issue's plan)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    ref = MLP()
    model = MLP()
    model.load_state_dict(ref.state_dict())
    parallelize_module(model, init_device_mesh("cpu", (2,)),
                       {"up": ColwiseParallel(), "down": RowwiseParallel()})
    return ref, model


def same(a: tl.Trace, b: tl.Trace) -> dict:
    """How a sharded trace compares with the unsharded one, op by op (collectives aside)."""
    ops = [op for op in a.ops if "communication" not in op.meta]
    values = [op.label for op, ref in zip(ops, b.ops) if op.saved and not (
        type(op.out) is torch.Tensor and torch.allclose(op.out, ref.out, atol=1e-5))]
    return {"labels": [op.label for op in ops] == [op.label for op in b.ops],
            "shapes": [op.shape for op in ops] == [op.shape for op in b.ops],
            "values_differ": values, "ops": len(ops),
            "collectives": [op.label for op in a.ops if "communication" in op.meta],
            "params": sum(p["numel"] for p in a.params.values()),
            "ref_params": sum(p["numel"] for p in b.params.values())}


def check_tp(out: dict) -> None:
    ref, model = mlp_pair()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    t, u = tl.trace(model, x), tl.trace(ref, x)
    out["tp"] = same(t, u)
    local = t["relu_1"].local
    out["tp"]["local"] = [type(local).__name__, [repr(p) for p in local.placements],
                          list(local.to_local().shape), list(local.device_mesh.shape)]
    out["tp"]["meta"] = t["linear_1"].meta["sharded"]
    out["tp"]["module_out"] = t.modules["up"].calls[0].output_ops
    out["tp"]["summary"] = str(tl.summary(model, x))
    with torch.no_grad():  # to_local() then hands the model DTensor's own local tensor
        out["tp"]["no_grad"] = same(tl.trace(model, x), u)
    tg, ug = tl.trace(model, x, save_grads="all"), tl.trace(ref, x, save_grads="all")
    tg.backward(lambda output: output.sum())
    ug.backward(lambda output: output.sum())
    out["tp"]["grads_differ"] = [op.label for op in ug.ops if op.kind == "op" and not (
        type(tg[op.label].grad) is torch.Tensor and
        torch.allclose(tg[op.label].grad, op.grad, atol=1e-5))]
    if dist.get_rank() == 0:
        t.save(Path(sys.argv[1]) / "tp.trace")  # rank 0 writes the whole values
    x2 = torch.randn(6, 8, generator=torch.Generator().manual_seed(5))
    source, ref_source = tl.trace(model, x2[:4]), tl.trace(ref, x2[:4])
    batch, ref_batch = tl.trace(model, x2), tl.trace(ref, x2)
    edits = {  # name -> the edit, or (the sharded model's, the unsharded model's)
        "patch_from_a_sharded_trace": ({"relu_1": tl.edits.patch(source)},
                                       {"relu_1": tl.edits.patch(ref_source)}),
        "mean_of_a_sharded_batch": ({"up": tl.edits.mean(batch)},
                                    {"up": tl.edits.mean(ref_batch)}),
        "scale_module_index": {"up": tl.edits.scale(3.0, index=(slice(None), slice(12, 20)))},
        "zero_module_index": {"up": tl.edits.zero(index=(slice(None), slice(0, 4)))},
        "zero_op_across_shards": {"relu_1": tl.edits.zero(index=(slice(None), slice(14, 20)))},
        "replace_module": {"up": tl.edits.replace(torch.linspace(-1, 1, 128).reshape(4, 32))},
        "add_partial_sum": {"linear_2": tl.edits.add(torch.arange(8.0))},
        "add_module_after_reduce": {"down": tl.edits.add(torch.arange(8.0))},
    }
    out["edits"] = {}
    for name, edit in edits.items():
        edit, ref_edit = edit if isinstance(edit, tuple) else (edit, edit)
        te, ue = tl.trace(model, x, edits=edit), tl.trace(ref, x, edits=ref_edit)
        with torch.no_grad():
            forward = model(x)  # the edit is gone: the model runs as before
        out["edits"][name] = {
            "output": torch.allclose(te.ops[-1].out, ue.ops[-1].out, atol=1e-5),
            "site_value": torch.allclose(te[edit_site(te, edit)].out,
                                         ue[edit_site(ue, edit)].out, atol=1e-5),
            "norm": [te.edits[0]["norm"], ue.edits[0]["norm"]],
            "model_restored": torch.allclose(forward, ref(x), atol=1e-5)}


def edit_site(trace: tl.Trace, edit: dict) -> str:
    site = next(iter(edit))
    return trace.modules[site].calls[0].output_ops[0] if site in trace.modules else site


def check_llama(out: dict) -> None:
    from transformers import LlamaForCausalLM

    ref, model = llama_pair()
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(2))
    out["llama"] = same(tl.trace(model, ids), tl.trace(ref, ids))
    edit = {"model.layers.0.self_attn.q_proj": tl.edits.zero(
        index=(slice(None), slice(None), slice(8, 40)))}  # across the two ranks' heads
    te, ue = tl.trace(model, ids, edits=edit), tl.trace(ref, ids, edits=edit)
    out["llama"]["edit"] = torch.allclose(te.ops[-1].out, ue.ops[-1].out, atol=1e-5)
    # TransformerLens's names read whole, patterns recomputed from the whole q and k; head and
    # pattern edits address the whole model's heads
    names = ["blocks.0.attn.hook_z", "blocks.1.hook_resid_post", "blocks.0.attn.hook_pattern",
             "blocks.1.attn.hook_k", "blocks.0.mlp.hook_post", "ln_final.hook_normalized"]
    tn, un = tl.trace(model, ids, save=names), tl.trace(ref, ids, save=names)
    out["llama"]["names_differ"] = [n for n in names if tn[n].out.shape != un[n].out.shape
                                    or not torch.allclose(tn[n].out, un[n].out, atol=1e-5)]
    out["llama"]["name_edits"] = []
    for edit in ({"blocks.0.attn.hook_z": tl.edits.zero(head=[1, 2])},
                 {"blocks.1.attn.hook_pattern": tl.edits.zero(
                     index=(slice(None), 3, slice(None), 0))}):  # head 3 (rank 1's) ignores key 0
        te, ue = tl.trace(model, ids, edits=edit), tl.trace(ref, ids, edits=edit)
        out["llama"]["name_edits"].append(torch.allclose(te.ops[-1].out, ue.ops[-1].out,
                                                         atol=1e-5))
    # the same Llama loaded with transformers' own plan (vocabulary-parallel embedding, lm_head
    # gathered): saved by rank 0, loaded sharded by both
    from transformers import DistributedConfig

    folder = Path(sys.argv[1]) / "tiny-llama"
    if dist.get_rank() == 0:
        ref.save_pretrained(folder)
    dist.barrier()
    auto = LlamaForCausalLM.from_pretrained(
        folder, distributed_config=DistributedConfig(tp_plan="auto")).eval()
    out["llama_auto"] = same(tl.trace(auto, ids), tl.trace(ref, ids))
    out["llama_auto"]["sharded"] = type(auto.model.embed_tokens.weight).__name__


class Block(nn.Module):
    """A GPT-2-style block with q, k, v and o as separate Linears (GPT-2's own fuses q, k and
    v in one Conv1D, which ColwiseParallel cannot split without mixing them)."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        y = self.ln_1(x)
        q, k, v = (m(y).view(b, t, -1, d // self.heads).transpose(1, 2)
                   for m in (self.q, self.k, self.v))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.proj(nn.functional.gelu(self.fc(self.ln_2(x))))


def check_block(out: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    ref = Block()
    model = Block()
    model.load_state_dict(ref.state_dict())
    parallelize_module(model, init_device_mesh("cpu", (2,)),
                       {**{n: ColwiseParallel() for n in ("q", "k", "v", "fc")},
                        "o": RowwiseParallel(), "proj": RowwiseParallel()})
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(6))
    t = tl.trace(model, x)
    out["block"] = same(t, tl.trace(ref, x))
    attention = next(op for op in t.ops if op.func == "scaled_dot_product_attention")
    out["block"]["attention"] = [attention.shape, attention.meta["sharded"]["placement"]]
    edit = {attention.label: tl.edits.zero(index=(slice(None), slice(1, 3)))}  # heads 1-2
    te, ue = tl.trace(model, x, edits=edit), tl.trace(ref, x, edits=edit)
    out["block"]["edit_heads"] = torch.allclose(te.ops[-1].out, ue.ops[-1].out, atol=1e-5)


def check_fsdp(out: dict) -> None:
    ref, model = fsdp_pair()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    t, u = tl.trace(model, x, save_grads="all"), tl.trace(ref, x, save_grads="all")
    out["fsdp"] = same(t, u)
    out["fsdp"]["parents"] = [op.parents for op in t.ops] == [op.parents for op in u.ops]
    out["fsdp"]["advisories"] = t.annotations["capture_advisories"]
    t.backward(lambda output: output.sum())
    u.backward(lambda output: output.sum())
    out["fsdp"]["grads_differ"] = [op.label for op in u.ops if op.kind == "op" and not
                                   torch.allclose(t[op.label].grad, u[op.label].grad,
                                                  atol=1e-5)]


def refusal(fn) -> dict:
    """What ``fn`` raised: its TorchLens code, or the error's type and first line."""
    try:
        fn()
    except tl.TorchLensError as exc:
        return {"code": exc.code, "teach": exc.teach}
    except Exception as exc:  # noqa: BLE001 - reported to the test, which names what it wants
        return {"error": type(exc).__name__, "message": str(exc).splitlines()[0][:300]}
    return {"code": None}


class Failing(MLP):
    """An MLP whose forward raises on rank 1 when told to: between the two sharded layers
    (``"mid"``, rank 0 then waits in ``down``'s all-reduce) or after them (``"late"``, rank 0's
    forward ends)."""

    fail: str | None = None

    def forward(self, x):
        h = torch.relu(self.up(x))
        if self.fail == "mid" and dist.get_rank() == 1:
            raise ValueError("rank 1's forward failed")
        out = self.down(h)
        if self.fail == "late" and dist.get_rank() == 1:
            raise ValueError("rank 1's forward failed")
        return out


def check_failures(out: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(4))  # the same on each rank
    rank = dist.get_rank()
    mode = "late" if sys.argv[2] == "late" else "mid"
    if mode == "mid":
        check_disagree(out, x, rank)
    torch.manual_seed(0)
    failing = Failing()
    parallelize_module(failing, init_device_mesh("cpu", (2,)),
                       {"up": ColwiseParallel(), "down": RowwiseParallel()})
    before = {k: v.to_local().clone() for k, v in failing.state_dict().items()}
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in failing.modules())
    failing.fail = mode
    out["failed"] = refusal(lambda: tl.trace(failing, x))
    out["failed_model_kept"] = all(torch.equal(before[k], v.to_local()) for k, v in
                                   failing.state_dict().items()) and hooks == sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) for m in failing.modules())


def check_disagree(out: dict, x: torch.Tensor, rank: int) -> None:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    ref, model = mlp_pair()
    # edits that differ between the ranks: refused on both, before the forward
    edits = {"up": tl.edits.zero(index=(slice(None), slice(0, 4 + rank)))}
    out["disagree"] = refusal(lambda: tl.trace(model, x, edits=edits))
    out["disagree_save"] = refusal(lambda: tl.trace(model, x, save=["relu_1"] if rank else
                                                    ["linear_1"]))
    out["after_disagree"] = same(tl.trace(model, x), tl.trace(ref, x))["values_differ"] == []
    ready = tl.trace(model, x, intervention_ready=True)
    out["push"] = refusal(lambda: ready.push({"relu_1": tl.edits.zero()}))
    out["run"] = torch.allclose(ready.run(x).ops[-1].out, tl.trace(ref, x).ops[-1].out,
                                atol=1e-5)
    out["grad_edits"] = refusal(lambda: tl.trace(model, x, save_grads=["relu_1"],
                                                 grad_edits={"relu_1": tl.edits.zero()}))
    out["compiled"] = refusal(lambda: tl.trace(model, x, save=["relu_1"], compile=True))
    # a forward whose ops differ between the ranks (a branch on the rank): refused when it
    # ends, before any value is gathered
    branching = Branching()
    branching.load_state_dict(ref.state_dict())
    parallelize_module(branching, model.up.weight.device_mesh,
                       {"up": ColwiseParallel(), "down": RowwiseParallel()})
    out["branching"] = refusal(lambda: tl.trace(branching, x))
    out["after_branching"] = same(tl.trace(model, x), tl.trace(ref, x))["values_differ"] == []


class Branching(MLP):
    """An MLP whose rank 1 runs one op more (a branch on rank-dependent data)."""

    def forward(self, x):
        h = torch.relu(self.up(x))
        if dist.get_rank() == 1:
            h = h * 1.0
        return self.down(h)


def rows(rec) -> dict:
    """A recording's rows per label, stored or in memory."""
    return {label: rec[label][0:rec.manifest["rows"]] if hasattr(rec, "manifest") else
            rec[label] for label in rec.labels}


def differ(a: dict, b: dict) -> list:
    """The labels whose rows differ (or that one side lacks)."""
    return sorted(k for k in set(a) | set(b) if k not in a or k not in b or a[k].shape !=
                  b[k].shape or not torch.allclose(a[k].float(), b[k].float(), atol=1e-5))


def check_record(out: dict) -> None:
    """tl.record of a tensor-parallel MLP and Llama (every rank every input, rank 0 writes) and
    of an FSDP2 MLP (each rank its share, forwards in lockstep): one store of whole rows, equal
    to the unsharded model's recording."""
    from torch.utils.data import DataLoader, DistributedSampler

    folder = Path(sys.argv[1])
    rank = dist.get_rank()
    ref, model = mlp_pair()
    xs = [torch.randn(3, 8, generator=torch.Generator().manual_seed(10 + i)) for i in range(5)]
    save = ["up", "relu_1", "linear_2"]
    want = rows(tl.record(ref, xs, save=save))
    store = tl.record(model, xs, save=save, to=folder / "tp")
    out["tp"] = {"differ": differ(rows(store), want), "labels": store.labels,
                 "world_size": store.manifest["world_size"],
                 "files": sorted(p.name for p in (folder / "tp").iterdir()),
                 "memory": differ(rows(tl.record(model, xs, save=save)), want)}
    edits = {"relu_1": tl.edits.zero(index=(slice(None), slice(12, 20)))}  # across the shards
    out["tp"]["edited"] = differ(rows(tl.record(model, xs, save=["linear_2"], edits=edits)),
                                 rows(tl.record(ref, xs, save=["linear_2"], edits=edits)))

    def stopping(n):  # a run killed after n inputs: the same on every rank
        for i, x in enumerate(xs):
            if i == n:
                raise KeyboardInterrupt
            yield x

    try:
        tl.record(model, stopping(2), save=save, to=folder / "resumed")
    except KeyboardInterrupt:
        dist.barrier()  # rank 0 has written what it kept
    kept = tl.recording.open(folder / "resumed").manifest["ranks"][0]["items"]
    resumed = tl.record(model, xs, save=save, to=folder / "resumed")
    out["tp"]["resumed"] = [kept, differ(rows(resumed), want)]
    out["tp"]["refusals"] = {
        "compile": refusal(lambda: tl.record(model, xs, save=save, compile=True)),
        "sampler": refusal(lambda: tl.record(
            model, DataLoader(torch.stack(xs), sampler=DistributedSampler(torch.stack(xs))),
            save=save, to=folder / "sampled")),
        "other_inputs": refusal(lambda: tl.record(model, [xs[rank]], save=save)),
        "other_store": refusal(lambda: tl.record(model, xs, save=["up"], to=folder / "tp"))}
    llama_ref, llama = llama_pair()
    ids = [torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(20 + i))
           for i in range(3)]
    save = ["model.layers.1.mlp", "model.layers.0.self_attn.o_proj", "model.norm"]
    out["llama"] = differ(rows(tl.record(llama, ids, save=save, reduce="mean",
                                         to=folder / "llama")),
                          rows(tl.record(llama_ref, ids, save=save, reduce="mean")))
    names = ["blocks.*.hook_resid_post", "blocks.1.attn.hook_pattern", "blocks.0.attn.hook_z"]
    named = tl.record(llama, ids, save=names, to=folder / "named")
    out["llama_names"] = [differ(rows(named), rows(tl.record(llama_ref, ids, save=names))),
                          sorted(named.labels)]
    ref, fsdp = fsdp_pair()
    save = ["up", "relu_1", "output_1"]
    store = tl.record(fsdp, xs, save=save, to=folder / "fsdp")  # 3 inputs on rank 0, 2 on 1
    mine = {k: v for k, v in rows(tl.record(ref, xs, save=save)).items()}
    out["fsdp"] = {"differ": differ(rows(store), mine), "rows": store.manifest["rows"],
                   "ranks": [r["items"] for r in store.manifest["ranks"]],
                   "complete": store.complete,
                   "resume": differ(rows(tl.record(fsdp, xs, save=save,
                                                   to=folder / "fsdp")), mine)}
    out["fsdp"]["one_input"] = differ(rows(tl.record(fsdp, xs[:1], save=save,
                                                     to=folder / "fsdp1")),
                                      {k: v[:3] for k, v in mine.items()})
    out["fsdp"]["names"] = refusal(lambda: tl.record(fsdp, xs, save=["blocks.0.hook_resid_post"]))
    # each rank its own batches (a DistributedSampler: 3 each, index 0 again as padding)
    loader = DataLoader(torch.stack(xs), sampler=DistributedSampler(torch.stack(xs),
                                                                    shuffle=False))
    sampled = tl.record(fsdp, loader, save=["relu_1"], to=folder / "fsdp_sampled")
    got, want_rows = rows(sampled)["relu_1"].reshape(-1, 32), mine["relu_1"].reshape(-1, 32)
    out["fsdp"]["sampler"] = [sampled.manifest["rows"], float(
        torch.cdist(got, want_rows).min(dim=1).values.max())]


def llama_pair() -> tuple[nn.Module, nn.Module]:
    """(a Llama from a config, the same weights sharded by the standard plan)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    ref = LlamaForCausalLM(config).eval()
    model = LlamaForCausalLM(config).eval()
    model.load_state_dict(ref.state_dict())
    plan = {}
    for i in range(config.num_hidden_layers):
        block = f"model.layers.{i}"
        plan.update({f"{block}.self_attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj",
                                                                           "v_proj")})
        plan.update({f"{block}.mlp.{n}": ColwiseParallel() for n in ("gate_proj", "up_proj")})
        plan[f"{block}.self_attn.o_proj"] = RowwiseParallel()
        plan[f"{block}.mlp.down_proj"] = RowwiseParallel()
    parallelize_module(model, init_device_mesh("cpu", (2,)), plan)
    return ref, model


def fsdp_pair() -> tuple[nn.Module, nn.Module]:
    """(the unsharded MLP, the same weights under FSDP2's fully_shard)."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    ref = MLP()
    model = MLP()
    model.load_state_dict(ref.state_dict())
    for module in (model.up, model.down, model):
        fully_shard(module)
    return ref, model


def main() -> None:
    folder, group = Path(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    out: dict = {}
    try:
        for check in ([check_tp, check_block, check_llama, check_fsdp] if group == "models"
                      else [check_record] if group == "record"
                      else [check_failures]):  # "failures" (mid-forward) or "late"
            check(out)
    except Exception:  # noqa: BLE001 - the test shows it
        out["crash"] = traceback.format_exc()
    (folder / f"{group}.rank{dist.get_rank()}.json").write_text(json.dumps(out, default=str))
    sys.stdout.flush()
    if group not in ("models", "record"):
        os._exit(0)  # a rank whose peer failed has no process group to close
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
