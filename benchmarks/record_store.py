"""tl.record to a store at dataset scale: throughput, memory, torchrun scale-out and reading.

Every figure is measured in one invocation (``hatch run bench:record``) and written to
``results/record_store.json`` and ``.md``. Parts:

- throughput: GPT-2 (12 layers) over prompts of 32 tokens (``--prompts``, 32 a batch), four
  residual-stream labels, to disk in bf16, against the plain no-grad forward loop over the same
  batches and against a hand-written forward-hook + ``torch.save`` loop;
- memory: peak RSS of the same recording over 1,000 and 10,000 inputs, each in a fresh process
  (a small GPT-2, so that 10,000 forwards take minutes, not an hour);
- scale-out: 2 ranks x 1 thread under torchrun against 1 rank x 1 thread, inputs/s, best of
  ``--rounds`` runs each, alternating; the plain forward loop split the same way beside it, as
  the ceiling two processes reach on this machine;
- reading: open a store of 1,048,576 rows, then stream it with ``rec.batches`` from the page
  cache, in order and shuffled;
- compiled: GPT-2 (12 layers) and a ViT-Base from configs, in memory: the plain eager loop, the
  plain ``torch.compile`` loop, ``tl.record`` eager and ``tl.record(compile=True)``, inputs/s
  after the first forward (each compiled run's first forward, compiling included, apart).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import write_results

HERE = Path(__file__).resolve().parent
# 1,000 inputs of the small GPT-2 make 16 MB of rows: 8 MB shards put both runs past the first
# shards, where the writer's memory (one shard filling, one being written) stays level
MEMORY_SHARD = 8 << 20


def gpt2(n_layer: int = 12, n_embd: int = 768, seed: int = 0):
    from transformers import GPT2Config, GPT2Model

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=max(1, n_embd // 64),
                        use_cache=False)
    return GPT2Model(config).eval()


def prompts(n: int, batch: int = 32, tokens: int = 32, vocab: int = 50257) -> list[dict]:
    """Tokenized prompts, ``batch`` a forward, as a tokenizer would hand them over."""
    gen = torch.Generator().manual_seed(1)
    out = []
    for start in range(0, n, batch):
        b = min(batch, n - start)
        out.append({"input_ids": torch.randint(0, vocab, (b, tokens), generator=gen),
                    "attention_mask": torch.ones(b, tokens, dtype=torch.long)})
    return out


def labels_for(model) -> list[str]:
    n = len(model.h)
    picks = sorted({round(n * k / 4) - 1 for k in (1, 2, 3, 4)} - {-1})
    return [f"h.{i}" for i in picks]


def plain_loop(model, batches) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        for batch in batches:
            model(**batch)
    return time.perf_counter() - start


def hook_loop(model, batches, labels, folder: Path) -> float:
    """What a user writes by hand: forward hooks copying real tokens, one torch.save a batch."""
    folder.mkdir(parents=True, exist_ok=True)
    kept: dict[str, torch.Tensor] = {}
    mask_box: list[torch.Tensor] = []
    handles = []
    for label in labels:
        def hook(mod, args, out, label=label):
            value = out[0] if isinstance(out, tuple) else out
            kept[label] = value[mask_box[0].bool()].to(torch.bfloat16).cpu()
        handles.append(model.get_submodule(label).register_forward_hook(hook))
    start = time.perf_counter()
    try:
        with torch.no_grad():
            for k, batch in enumerate(batches):
                mask_box[:] = [batch["attention_mask"]]
                model(**batch)
                torch.save(dict(kept), folder / f"batch-{k:06d}.pt")
    finally:
        for h in handles:
            h.remove()
    return time.perf_counter() - start


def tl_record(model, batches, labels, folder: Path) -> float:
    import torchlens as tl

    start = time.perf_counter()
    tl.record(model, batches, save=labels, to=folder, dtype=torch.bfloat16, progress=False,
              overwrite=True)
    return time.perf_counter() - start


def throughput(args) -> dict:
    model = gpt2()
    batches = prompts(args.prompts)
    labels = labels_for(model)
    work = Path(tempfile.mkdtemp(prefix="tl-bench-"))
    with torch.no_grad():
        model(**batches[0])  # warm-up
    rows = {"plain": [], "hooks": [], "record": []}
    methods = {"plain": lambda: plain_loop(model, batches),
               "hooks": lambda: hook_loop(model, batches, labels, work / "hooks"),
               "record": lambda: tl_record(model, batches, labels, work / "store")}
    order = list(methods)
    for k in range(args.rounds):  # interleaved and rotated, so drift hits every method alike
        for name in order[k % 3:] + order[:k % 3]:
            # the kernel writes a loop's unsynced files back up to 30 s later: flush them here,
            # untimed, so one method's deferred writes never land in the next one's time
            os.sync()
            rows[name].append(methods[name]())
    size = sum(p.stat().st_size for p in (work / "store").rglob("*") if p.is_file())
    shutil.rmtree(work)
    best = {k: min(v) for k, v in rows.items()}
    return {"prompts": args.prompts, "labels": labels, "seconds": rows, "store_bytes": size,
            "inputs_per_s": {k: args.prompts / v for k, v in best.items()},
            "record_vs_plain": best["plain"] / best["record"],
            "record_vs_hooks": best["hooks"] / best["record"]}


def vit(seed: int = 0):
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(seed)
    return ViTModel(ViTConfig(), add_pooling_layer=False).eval()


def images(n: int, batch: int = 8) -> list[dict]:
    gen = torch.Generator().manual_seed(2)
    return [{"pixel_values": torch.randn(min(batch, n - s), 3, 224, 224, generator=gen)}
            for s in range(0, n, batch)]


def _timed_loop(call, batches, compiled: bool) -> tuple[float, int, float]:
    """(first forward's seconds, inputs timed, their seconds): a compiled loop's first forward
    (compiling) apart, an eager loop's counted."""
    with torch.no_grad():
        t0 = time.perf_counter()
        call(batches[0])
        t1 = time.perf_counter()
        for batch in batches[1:]:
            call(batch)
        end = time.perf_counter()
    rest = batches[1:] if compiled else batches
    return t1 - t0, _count(rest), end - (t1 if compiled else t0)


def _count(batches) -> int:
    return sum(len(next(iter(b.values()))) for b in batches)


def _timed_record(model, batches, labels, compile: bool) -> tuple[float, int, float, dict]:
    """As ``_timed_loop``, for one tl.record call: compiled, its one-time work (placing the
    sites by one eager capture, the first forward with compiling) apart."""
    import torchlens as tl

    t0 = time.perf_counter()
    rec = tl.record(model, batches, save=labels, progress=False, compile=compile)
    total = time.perf_counter() - t0
    if not compile:
        return 0.0, _count(batches), total, {}
    facts = rec.compiled
    first = facts["first_forward_s"] + facts["place_s"]
    return first, _count(batches[1:]), total - first, facts


def _compiled_case(model, batches, labels, rounds: int) -> dict:
    """The four loops, interleaved ``rounds`` times, over the same model and batches."""
    plain_compiled = torch.compile(model)
    methods = {
        "eager": lambda: _timed_loop(lambda b: model(**b), batches, False),
        "compiled": lambda: _timed_loop(lambda b: plain_compiled(**b), batches, True),
        "record": lambda: _timed_record(model, batches, labels, False)[:3],
        "record_compiled": lambda: _timed_record(model, batches, labels, True)}
    rows: dict[str, list] = {k: [] for k in methods}
    counts: dict[str, int] = {}
    firsts: dict[str, float] = {}
    facts: dict = {}
    for _ in range(rounds):
        for method, run in methods.items():
            first, counts[method], rest, *more = run()
            if method in ("compiled", "record_compiled"):
                firsts.setdefault(method, first)
            if more:
                facts = more[0]
            rows[method].append(rest)
    ips = {k: counts[k] / min(v) for k, v in rows.items()}
    return {"labels": labels, "inputs": counts, "seconds": rows, "inputs_per_s": ips,
            "first_forward_s": firsts, "facts": facts,
            "record_compiled_vs_compiled": ips["record_compiled"] / ips["compiled"],
            "compile_gain_plain": ips["compiled"] / ips["eager"],
            "compile_gain_record": ips["record_compiled"] / ips["record"]}


def compiled(args) -> dict:
    gpt = gpt2()
    return {"gpt2": _compiled_case(gpt, prompts(args.compiled_inputs), labels_for(gpt),
                                   args.rounds),
            "vit": _compiled_case(model := vit(), images(args.compiled_inputs // 4),
                                  _blocks(model), args.rounds)}


def _blocks(model) -> list[str]:
    """Four of a ViT's blocks, evenly spaced (``layers.N`` or ``encoder.layer.N``)."""
    blocks = [a for a, _ in model.named_modules() if re.fullmatch(r"(encoder\.)?layers?\.\d+", a)]
    return [blocks[i] for i in (2, 5, 8, 11)]


def _child(argv: list[str], threads: int | None = None) -> dict:
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env,
                          cwd=HERE.parent, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def memory_child(n: int, folder: str) -> None:
    """One recording of ``n`` inputs in this fresh process; prints the peak RSS sampled while it
    ran (every 20 ms) and the RSS before it (torch's own start-up is the same in both runs)."""
    import threading

    import torchlens as tl

    model = gpt2(n_layer=2, n_embd=128)
    batches = prompts(n, batch=8, vocab=model.config.vocab_size)
    with torch.no_grad():
        model(**batches[0])
    before = _rss()
    peak, done = [before], threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], _rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    tl.record(model, batches, save=labels_for(model), to=folder, dtype=torch.bfloat16,
              progress=False, shard_bytes=MEMORY_SHARD)
    done.set()
    sampler.join()
    peak[0] = max(peak[0], _rss())
    print(json.dumps({"inputs": n, "peak_rss": peak[0], "rss_before": before,
                      "max_rss_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                      * 1024}))


def memory(args) -> dict:
    out = []
    for n in args.memory_inputs:
        folder = tempfile.mkdtemp(prefix="tl-bench-mem-")
        out.append(_child([__file__, "--memory-child", str(n), folder]))
        shutil.rmtree(folder)
    small, big = out[0]["peak_rss"], out[-1]["peak_rss"]
    return {"runs": out, "growth": big / small - 1}


def rank_child(folder: str, n: int, plain: bool = False) -> None:
    """One rank's recording (or the single rank's); prints inputs/s of its own tl.record.
    ``plain``: the same share of inputs through the plain no-grad forward loop instead, the
    control that says how far two processes scale on this machine at all."""
    import torch.distributed as dist

    import torchlens as tl

    model = gpt2(n_layer=12)
    batches = prompts(n, batch=1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
        dist.barrier()
    if plain:
        seconds = plain_loop(model, batches[int(os.environ.get("RANK", "0"))::world])
    else:
        start = time.perf_counter()
        tl.record(model, batches, save=labels_for(model), to=folder, dtype=torch.bfloat16,
                  progress=False)
        seconds = time.perf_counter() - start
    if world > 1:
        box = [None] * world
        dist.all_gather_object(box, seconds)
        seconds = max(box)
        rank = dist.get_rank()
        dist.destroy_process_group()
        if rank:
            return
    print(json.dumps({"world": world, "seconds": seconds, "inputs_per_s": n / seconds}))


def scale_out(args) -> dict:
    """1 rank against 2 ranks under torchrun, alternating, best of ``args.rounds`` each (a 2-core
    VM's neighbours move one run by tens of percent); the plain forward loop split the same way
    alongside, as the machine's own ceiling."""
    n = args.scale_inputs
    runs: dict[tuple[str, int], list[dict]] = {}
    for _ in range(args.rounds):
        for method in ("record", "plain"):
            flag = ["--rank-child"] if method == "record" else ["--plain-rank-child"]
            for world, cmd in ((1, [__file__, *flag]),
                               (2, ["-m", "torch.distributed.run", "--standalone",
                                    "--nproc-per-node", "2", __file__, *flag])):
                folder = tempfile.mkdtemp()
                start = time.perf_counter()
                run = _child([*cmd, folder, str(n)], threads=1)
                run["wall"] = time.perf_counter() - start
                runs.setdefault((method, world), []).append(run)
                shutil.rmtree(folder)

    def best(method: str, world: int) -> dict:
        return max(runs[(method, world)], key=lambda r: r["inputs_per_s"])

    def speedup(method: str) -> float:
        return best(method, 2)["inputs_per_s"] / best(method, 1)["inputs_per_s"]

    ones, twos = runs[("record", 1)], runs[("record", 2)]
    return {"inputs": n, "rounds": args.rounds, "one_rank": best("record", 1),
            "two_ranks": best("record", 2), "all_one_rank": ones, "all_two_ranks": twos,
            "speedup": speedup("record"),
            "speedup_wall": min(r["wall"] for r in ones) / min(r["wall"] for r in twos),
            "plain_one_rank": runs[("plain", 1)], "plain_two_ranks": runs[("plain", 2)],
            "plain_speedup": speedup("plain")}


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reading(args) -> dict:
    import torchlens as tl

    rows, width, per_input = 1 << 20, 128, 1 << 14
    folder = Path(tempfile.mkdtemp(prefix="tl-bench-read-"))
    gen = torch.Generator().manual_seed(2)
    inputs = (torch.rand(per_input, width, generator=gen) for _ in range(rows // per_input))
    start = time.perf_counter()
    tl.record(_Relu(), inputs, save=["relu_1"], to=folder, progress=False)
    write_s = time.perf_counter() - start
    before = _rss()
    start = time.perf_counter()
    rec = tl.recording.open(folder)
    open_s = time.perf_counter() - start
    first = rec["relu_1"][0:1]  # first access builds the row table
    ready_s = time.perf_counter() - start
    held = _rss() - before
    nbytes = rows * width * 4
    out = {"rows": rows, "width": width, "bytes": nbytes, "write_s": write_s, "open_s": open_s,
           "open_and_first_row_s": ready_s, "rss_after_open_bytes": held, "first": first.shape[0]}
    for shuffle in (False, True):
        for _ in range(2):  # the first pass warms the page cache; the second is measured
            start = time.perf_counter()
            for _batch in rec.batches("relu_1", batch_size=args.read_batch, shuffle=shuffle):
                pass
            seconds = time.perf_counter() - start
        out[f"gb_per_s_{'shuffled' if shuffle else 'in_order'}"] = nbytes / seconds / 1e9
    shutil.rmtree(folder)
    return out


class _Relu(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)


def machine() -> str:
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, Python "
            f"{platform.python_version()}")


def markdown(res: dict) -> str:
    lines = ["# tl.record to a store", "", f"Machine: {res['machine']}", ""]
    if "throughput" in res:
        t = res["throughput"]
        ips = t["inputs_per_s"]
        lines += [f"Throughput: GPT-2 (12 layers, 768 wide), {t['prompts']} prompts of 32 "
                  f"tokens, 32 a forward; labels {', '.join(t['labels'])}; bf16 to disk "
                  f"({t['store_bytes'] / 1e6:.0f} MB); best of {len(t['seconds']['plain'])} "
                  "interleaved rounds, the order rotated each round.",
                  "", "| method | inputs/s |", "|---|---:|",
                  f"| plain no-grad forward loop | {ips['plain']:.1f} |",
                  f"| forward hooks + torch.save loop | {ips['hooks']:.1f} |",
                  f"| tl.record(to=, dtype=bfloat16) | {ips['record']:.1f} |", ""]
        sec = t["seconds"]  # each round ran the three back to back: a ratio less moved by drift
        lines += ["Per round, seconds (plain / hooks / record) and record's time over the "
                  "hook loop's: " + "; ".join(
                      f"{p:.1f} / {h:.1f} / {r:.1f} ({r / h:.2f})"
                      for p, h, r in zip(sec["plain"], sec["hooks"], sec["record"])) + ".", ""]
    if "compiled" in res:
        for name, c in res["compiled"].items():
            what = "GPT-2 (12 layers, 768 wide), prompts of 32 tokens, 32 a forward" \
                if name == "gpt2" else "ViT-Base (12 layers, 224x224), 8 images a forward"
            ips = c["inputs_per_s"]
            lines += [f"Compiled recording, {what}; in memory, sites {', '.join(c['labels'])}; "
                      f"{c['inputs']['eager']} inputs (the compiled rows: those after the "
                      f"first forward), best of {len(c['seconds']['eager'])} interleaved "
                      "rounds. First forward, compiling included, apart: plain torch.compile "
                      f"{c['first_forward_s']['compiled']:.1f} s, tl.record(compile=True) "
                      f"{c['first_forward_s']['record_compiled']:.1f} s (with the one eager "
                      "capture that places the sites; each call compiles its own graph, from "
                      "inductor's cache after the first).", "",
                      "| method | inputs/s |", "|---|---:|",
                      f"| plain no-grad eager loop | {ips['eager']:.1f} |",
                      f"| plain torch.compile loop | {ips['compiled']:.1f} |",
                      f"| tl.record eager | {ips['record']:.1f} |",
                      f"| tl.record(compile=True) | {ips['record_compiled']:.1f} |", "",
                      f"tl.record(compile=True)'s report: {c['facts']}.", ""]
    lines += ["| target | measured | verdict |", "|---|---:|---:|"]
    if "throughput" in res:
        t = res["throughput"]
        lines.append(f"| record ≥ 0.85x the plain forward loop | {t['record_vs_plain']:.2f}x | "
                     f"{_v(t['record_vs_plain'] >= 0.85)} |")
        lines.append(f"| record ≥ the hook + torch.save loop | {t['record_vs_hooks']:.2f}x | "
                     f"{_v(t['record_vs_hooks'] >= 1.0)} |")
    if "memory" in res:
        m = res["memory"]
        a, b = m["runs"][0], m["runs"][-1]
        lines.append(f"| peak RSS while recording, {a['inputs']:,} vs {b['inputs']:,} inputs "
                     f"within 10% (small GPT-2) | {a['peak_rss'] / 1e6:.0f} MB vs "
                     f"{b['peak_rss'] / 1e6:.0f} MB ({m['growth']:+.1%}; "
                     f"{a['rss_before'] / 1e6:.0f} MB before) | "
                     f"{_v(abs(m['growth']) <= 0.10)} |")
    if "scale_out" in res:
        s = res["scale_out"]
        lines.append(f"| 2 ranks x 1 thread ≥ 1.7x 1 rank x 1 thread (GPT-2, {s['inputs']} "
                     f"prompts, best of {s.get('rounds', 1)} each) | {s['speedup']:.2f}x "
                     f"(wall incl. start-up "
                     f"{s['speedup_wall']:.2f}x) | {_v(s['speedup'] >= 1.7)} |")
        if "plain_speedup" in s:
            lines.append(f"| (control, no target) the plain no-grad loop split the same way, 2 "
                         f"processes over 1 | {s['plain_speedup']:.2f}x | -- |")
    if "reading" in res:
        r = res["reading"]
        lines.append(f"| open a {r['rows']:,}-row store well under 1 s | {r['open_s'] * 1e3:.1f}"
                     f" ms (first row {r['open_and_first_row_s'] * 1e3:.0f} ms, "
                     f"{r['rss_after_open_bytes'] / 1e6:.0f} MB held) | "
                     f"{_v(r['open_and_first_row_s'] < 0.5)} |")
        lines.append(f"| rec.batches ≥ 1 GB/s from the page cache | in order "
                     f"{r['gb_per_s_in_order']:.2f} GB/s, shuffled "
                     f"{r['gb_per_s_shuffled']:.2f} GB/s | "
                     f"{_v(r['gb_per_s_in_order'] >= 1.0)} |")
    for name, c in res.get("compiled", {}).items():
        lines.append(f"| {name}: tl.record(compile=True) ≥ 0.95x the plain compiled loop | "
                     f"{c['record_compiled_vs_compiled']:.2f}x | "
                     f"{_v(c['record_compiled_vs_compiled'] >= 0.95)} |")
        lines.append(f"| {name}: compiling gains tl.record what it gains the plain loop | "
                     f"record {c['compile_gain_record']:.2f}x, plain "
                     f"{c['compile_gain_plain']:.2f}x | "
                     f"{_v(c['compile_gain_record'] >= 0.95 * c['compile_gain_plain'])} |")
    return "\n".join(lines) + "\n"


def _v(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-inputs", type=int, nargs=2, default=[1000, 10000])
    parser.add_argument("--scale-inputs", type=int, default=192)
    parser.add_argument("--read-batch", type=int, default=4096)
    parser.add_argument("--compiled-inputs", type=int, default=256)
    parser.add_argument("--only", default="throughput,memory,scale_out,reading,compiled")
    parser.add_argument("--json", default=str(HERE / "results" / "record_store.json"))
    parser.add_argument("--memory-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--rank-child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--plain-rank-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        return memory_child(int(args.memory_child[0]), args.memory_child[1])
    if args.rank_child:
        return rank_child(args.rank_child[0], int(args.rank_child[1]))
    if args.plain_rank_child:
        return rank_child(args.plain_rank_child[0], int(args.plain_rank_child[1]), plain=True)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    res: dict = {"machine": machine()}
    for part in args.only.split(","):
        print(f"... {part}", file=sys.stderr, flush=True)
        res[part] = globals()[part](args)
    write_results(args.json, res, markdown(res))


if __name__ == "__main__":
    main()
