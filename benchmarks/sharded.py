"""What tracing a tensor-parallel model costs: a 2-rank ``tl.trace`` against the 2-rank plain
forward, and the bytes a whole-value read moves (issue 60).

Run ``hatch run bench:sharded`` (``--runs 10``): it launches itself under torchrun on two CPU
processes (gloo, one thread each). Model: a Llama from ``LlamaConfig`` (4 layers, hidden 256,
8 heads, 4 kv heads, 32 tokens), random weights, eval, sharded with the standard plan
(``ColwiseParallel`` q, k, v, gate, up; ``RowwiseParallel`` o, down). Timed on rank 0 after a
barrier, median of ``--runs`` rounds: the plain no-grad forward, ``tl.trace(save=None)`` (the
graph only: no value gathered) and ``tl.trace(save="all")`` (every value gathered whole when
the forward ends). Bytes: what each rank receives to make the saved values whole (the whole
value's bytes less its own part's, over the sharded ops), and the bytes of the forward's own
collectives. Results: ``benchmarks/results/sharded.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import machine, save_results  # noqa: E402


def _model():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=688,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    plan = {}
    for i in range(config.num_hidden_layers):
        block = f"model.layers.{i}"
        plan.update({f"{block}.self_attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj",
                                                                           "v_proj")})
        plan.update({f"{block}.mlp.{n}": ColwiseParallel() for n in ("gate_proj", "up_proj")})
        plan[f"{block}.self_attn.o_proj"] = RowwiseParallel()
        plan[f"{block}.mlp.down_proj"] = RowwiseParallel()
    parallelize_module(model, init_device_mesh("cpu", (dist.get_world_size(),)), plan)
    return model, torch.randint(0, 1024, (1, 32), generator=torch.Generator().manual_seed(1))


def worker(runs: int) -> None:
    import torch.distributed as dist

    import torchlens as tl

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    model, ids = _model()

    def plain():
        with torch.no_grad():
            return model(ids)

    methods = {"plain forward": plain,
               "tl.trace(save=None)": lambda: tl.trace(model, ids, save=None),
               "tl.trace(save='all')": lambda: tl.trace(model, ids)}
    times: dict[str, list[float]] = {name: [] for name in methods}
    for fn in methods.values():  # warm-up
        fn()
    for _ in range(runs):
        for name, fn in methods.items():
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    trace = tl.trace(model, ids)
    sharded = [op for op in trace.ops if isinstance(op.meta.get("sharded", {}).get("placement"),
                                                     list)]
    received = 0
    for op in sharded:
        local = 1
        for d in op.meta["sharded"]["local_shape"]:
            local *= d
        whole_elems = 1
        for d in op.shape:
            whole_elems *= d
        itemsize = op.nbytes // max(whole_elems, 1)
        placement = op.meta["sharded"]["placement"][0]
        # a shard: the others' parts come in; a partial sum: an all-reduce of the whole
        received += (whole_elems - local) * itemsize if placement.startswith("Shard") else \
            op.nbytes
    collectives = sum(op.meta["communication"]["bytes"] for op in trace.ops
                      if "communication" in op.meta)
    if dist.get_rank() == 0:
        plain_ms = statistics.median(times["plain forward"]) * 1e3
        report = {"machine": machine(), "world_size": dist.get_world_size(), "runs": runs,
                  "ops": len(trace.ops), "sharded_ops": len(sharded),
                  "median_ms": {k: statistics.median(v) * 1e3 for k, v in times.items()},
                  "gather_bytes_received_per_rank": received,
                  "forward_collective_bytes": collectives,
                  "saved_bytes_whole": sum(op.nbytes for op in trace.ops if op.saved)}
        lines = [f"Llama 4 layers, hidden 256, 32 tokens, {dist.get_world_size()} ranks (gloo, "
                 f"CPU, 1 thread each), median of {runs}:"]
        for name, ms in report["median_ms"].items():
            lines.append(f"  {name:24s} {ms:8.1f} ms  {ms / plain_ms:5.2f}x the plain forward")
        lines.append(f"  ops {len(trace.ops)}, sharded {len(sharded)}; making the saved values "
                     f"whole moves {received / 1e6:.2f} MB into each rank (the forward's own "
                     f"collectives: {collectives / 1e6:.2f} MB; all saved values whole: "
                     f"{report['saved_bytes_whole'] / 1e6:.2f} MB)")
        print("\n".join(lines))
        save_results("sharded", report, lines)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    if "RANK" in os.environ:
        worker(args.runs)
        return
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", __file__, "--runs", str(args.runs)], check=True,
                   env=env)


if __name__ == "__main__":
    main()
