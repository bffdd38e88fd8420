"""TorchLens capture overhead, against a plain forward and against peers (``hatch run bench:run``).

Everything runs on the CPU. For tinyops (300 x ``Linear(8, 8)``, relu, ``+ 1`` on 1x8: ~900
dispatch-bound ops), torchvision resnet18 (1x3x224x224) and GPT-2 (``GPT2Config()``: 12 layers, 768
wide, random init, 32 token ids) it times, in rotating rounds of 5 back-to-back calls per method (no
``gc.collect()`` between calls, one before each block), the plain forward under ``torch.no_grad()``
(twice, as two methods: the second one's ratio is the run's noise), a bare ``TorchFunctionMode``
(the floor of a Python-level mode), ``tl.trace(save=None)``, ``tl.trace(save="all")``,
``tl.record`` of 4 ops, ``tl.summary``, the pinned capture ``tl.draw`` makes and the whole
``tl.draw``, torchinfo's ``summary`` and torchview's ``draw_graph``; torchlens
2.36.1 runs in its own process (the ``bench-peer`` env) against its own plain forward. Every figure
is a ratio of means to the plain forward of the process that measured it (medians shown too), a
time per op, and each call's page faults and kernel time. Then GPT-2 at 2, 4, 8 and 16 layers:
metadata-only capture time per op and metadata bytes per op. Last, for attribution only, the
three models again in two child processes, glibc's defaults and its heap trimming off.

    hatch run bench:run              # full run; writes benchmarks/results/latest.{json,md}
    hatch run bench:run --quick      # smoke test: 3 runs, no peers; writes results/quick.{json,md}
    hatch run bench:run --help
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from _common import (  # noqa: E402
    GPT2_CLASSES,
    MODELS,
    bare_calls,
    bare_forward,
    build_model,
    machine,
    plain_forward,
    summarize,
    time_rounds,
)

SCALING_LAYERS = (2, 4, 8, 16)

# Method keys, in table order, with their row labels (versions are filled in at run time).
ROWS = {
    "plain": "plain forward (no_grad)",
    "plain_again": "plain forward again, a method of its own (this run's noise: ideally 1.00x)",
    "bare": "bare TorchFunctionMode (floor)",
    "tl_meta": 'torchlens trace(save=None)',
    "tl_all": 'torchlens trace(save="all")',
    "tl_engine": "torchlens trace(save=None), handler a pass-through (attribution)",
    "tl_record": "torchlens record(save=4 ops)",
    "tl_summary": "torchlens summary",
    "tl_draw_capture": "torchlens draw: capture only",
    "tl_draw": 'torchlens draw(file_format="svg")',
    "torchinfo": "torchinfo {v} summary",
    "torchview": "torchview {v} draw_graph",
    "peer_tl": "torchlens {v} trace (all activations)",
}
PEERS = ("torchinfo", "torchview", "peer_tl")

# (model, method, at most this many times the plain forward), all ratios of means.
TARGET_RATIOS = (
    ("tinyops", "tl_meta", 3.0), ("tinyops", "tl_all", 3.5), ("tinyops", "tl_record", 2.5),
    ("resnet18", "tl_meta", 1.10), ("resnet18", "tl_all", 1.35),
    ("gpt2", "tl_meta", 1.10), ("gpt2", "tl_all", 1.35),
)
TARGET_BARE = (("tinyops", "tl_meta", 1.5),)  # overhead per op at most this many times bare's
TARGET_VS_TORCHINFO = (("resnet18", "gpt2"), ("tl_summary", "tl_draw_capture"))
TARGET_PEER_SPEEDUP = 8.0
TARGET_PEER_MODELS = ("resnet18", "gpt2")
TARGET_FLAT = 0.25

# The attribution run: glibc keeps freed heap memory instead of returning it to the kernel, so
# the next call's allocations are not fresh pages (process-wide settings: a user's to make).
ALLOCATOR_ENV = {"MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_MMAP_THRESHOLD_": str(32 << 20)}
ALLOCATOR_ENV_TEXT = "MALLOC_TRIM_THRESHOLD_=1 GiB, MALLOC_MMAP_THRESHOLD_=32 MiB"
ALLOCATOR_MODELS = ("tinyops", "resnet18", "gpt2")
ALLOCATOR_METHODS = ("bare", "tl_meta", "tl_all", "tl_record")


# --------------------------------------------------------------------------------------- methods


def methods_for(tl: Any, model: torch.nn.Module, x: Any, skip: set[str],
                draw_dir: str) -> tuple[dict[str, Callable[[], Any]], dict[str, str]]:
    """The timed callables for one model, and why any method is not timed."""
    methods: dict[str, Callable[[], Any]] = {"plain": plain_forward(model, x)}
    missing: dict[str, str] = {}
    if "plain_again" not in skip:
        methods["plain_again"] = plain_forward(model, x)
    if "bare" not in skip:
        methods["bare"] = bare_forward(model, x)

    def trace(save: Any) -> Callable[[], Any]:
        def run() -> Any:
            with torch.no_grad():
                return tl.trace(model, x, save=save)

        return run

    if "tl_meta" not in skip:
        methods["tl_meta"] = trace(None)
    if "tl_all" not in skip:
        methods["tl_all"] = trace("all")
    if "tl_engine" not in skip:
        methods["tl_engine"] = engine_only(trace(None))

    if "tl_record" not in skip and hasattr(tl, "record"):
        picked = record_labels(tl, model, x)

        def record() -> Any:
            with torch.no_grad():
                return tl.record(model, x, save=picked, progress=False)

        methods["tl_record"] = record

    if "tl_summary" not in skip:
        if hasattr(tl, "summary"):
            methods["tl_summary"] = lambda: tl.summary(model, x)
        else:
            missing["tl_summary"] = "n/a (tl.summary not installed)"

    if "tl_draw_capture" not in skip:
        capture = draw_capture(model, x)
        if capture is not None:
            methods["tl_draw_capture"] = capture
        else:
            missing["tl_draw_capture"] = "n/a (torchlens.verbs.pinned_trace not installed)"

    if "tl_draw" not in skip:
        if hasattr(tl, "draw"):
            counter = iter(range(1_000_000))

            def draw() -> Any:
                path = os.path.join(draw_dir, f"draw_{next(counter)}")
                return tl.draw(model, x, file_format="svg", path=path)

            methods["tl_draw"] = draw
        else:
            missing["tl_draw"] = "n/a (tl.draw not installed)"

    if "torchinfo" not in skip:
        try:
            from torchinfo import summary

            methods["torchinfo"] = lambda: summary(model, input_data=x, verbose=0, device="cpu")
        except ImportError as err:
            missing["torchinfo"] = f"n/a (torchinfo not importable: {err})"

    if "torchview" not in skip:
        try:
            from torchview import draw_graph

            methods["torchview"] = lambda: draw_graph(model, input_data=x, device="cpu",
                                                      save_graph=False)
        except ImportError as err:
            missing["torchview"] = f"n/a (torchview not importable: {err})"
    return methods, missing


def record_labels(tl: Any, model: torch.nn.Module, x: Any) -> list[str]:
    """The labels ``tl.record`` is timed with: four ops spread over the forward."""
    with torch.no_grad():
        labels = [op.label for op in tl.trace(model, x, save=None) if op.kind == "op"]
    return labels[:: max(1, len(labels) // 4)][:4]


def engine_only(run: Callable[[], Any]) -> Callable[[], Any]:
    """``run`` (a ``save=None`` trace) with the recorder's handler only calling each function:
    the capture's cost apart from recording ops (module frames, the model's inventory, the
    Trace's meta). Attribution only: the trace it makes is empty."""
    from torchlens.capture.recorder import Recorder

    def passthrough(self: Any, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        return func(*args, **kwargs) if kwargs else func(*args)

    def timed() -> Any:
        handler = Recorder.__dict__["__torch_function__"]
        Recorder.__torch_function__ = passthrough
        try:
            return run()
        finally:
            Recorder.__torch_function__ = handler

    return timed


def draw_capture(model: torch.nn.Module, x: Any) -> Callable[[], Any] | None:
    """The pinned capture ``tl.draw(model, x)`` makes before it lays out and renders, called as
    ``tl.draw`` calls it (a mapping of forward keywords goes positionally, as ``x``)."""
    try:
        from torchlens import verbs
    except ImportError:
        return None
    if not hasattr(verbs, "pinned_trace"):
        return None
    options = (verbs._options(None, None, None) if hasattr(verbs, "_options")
               else {"tokenizer": None, "processor": None, "preprocess": None, "labels": None})

    def run() -> Any:
        return verbs.pinned_trace(model, x, input_kwargs=None, input_shape=None, surface="draw",
                                  options=options)

    return run


def op_counts(tl: Any, model: torch.nn.Module, x: Any) -> dict[str, int]:
    """Nodes of a metadata-only trace (``len(trace)``), among them the captured torch ops, and
    the calls the bare mode sees."""
    with torch.no_grad():
        tr = tl.trace(model, x, save=None)
    rows = tr.rows()
    return {"nodes": len(tr), "ops": sum(1 for r in rows if r.get("kind") == "op") or len(tr),
            "bare_calls": bare_calls(model, x)}


def metadata_bytes(tl: Any, model: torch.nn.Module, x: Any) -> dict[str, int]:
    """Python heap held by a metadata-only trace, measured with ``tracemalloc``.

    ``retained``: traced bytes allocated by the capture and still alive while the trace is
    (after a garbage collection); ``peak``: the peak during the capture, both above the level before
    it. Tensor storage does not go through Python's allocator, so neither counts activations or
    the model output's data -- only the trace's metadata objects. ``after_del``: what stays
    allocated after the trace is dropped (bounded caches and dict capacity, e.g. the modules' hook
    dicts; it levels off over repeated captures). A warm-up capture first keeps one-time caches
    out of the figure.
    """
    with torch.no_grad():
        tl.trace(model, x, save=None)
    gc.collect()
    tracemalloc.start()
    try:
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        with torch.no_grad():
            tr = tl.trace(model, x, save=None)
        gc.collect()
        current, peak = tracemalloc.get_traced_memory()
        del tr
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return {"retained": current - base, "peak": peak - base, "after_del": after - base}


# ------------------------------------------------------------------------------------------ peer


def peer_python(explicit: str | None) -> tuple[str | None, str]:
    """The bench-peer env's interpreter, creating the env when it is missing; else why not."""
    if explicit:
        return (explicit, "") if Path(explicit).exists() else (None, f"{explicit} does not exist")
    hatch = shutil.which("hatch")
    if not hatch:
        return None, "hatch is not on PATH (needed to find or create the bench-peer env)"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    try:
        found = subprocess.run([hatch, "env", "find", "bench-peer"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"`hatch env find bench-peer` failed: {err}"
    if found.returncode != 0 or not found.stdout.strip():
        return None, f"`hatch env find bench-peer` failed: {found.stderr.strip()[-500:]}"
    python = Path(found.stdout.strip().splitlines()[-1]) / "bin" / "python"
    if not python.exists():
        print("creating the bench-peer env (torchlens 2.36.1; installs torch, takes minutes) ...",
              flush=True)
        try:
            made = subprocess.run([hatch, "env", "create", "bench-peer"], cwd=ROOT, env=env,
                                  capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as err:
            return None, f"`hatch env create bench-peer` failed: {err}"
        if made.returncode != 0 or not python.exists():
            tail = (made.stderr or made.stdout).strip()[-800:]
            return None, f"`hatch env create bench-peer` failed (rc {made.returncode}): {tail}"
    return str(python), ""


def run_peer(args: argparse.Namespace, models: list[str]) -> dict[str, Any]:
    """Run ``peer_torchlens.py`` in the bench-peer env; its JSON, or ``{"error": why}``."""
    python, why = peer_python(args.peer_python)
    if python is None:
        return {"error": why}
    cmd = [python, str(HERE / "peer_torchlens.py"), "--runs", str(args.peer_runs),
           "--warmup", str(args.peer_warmup), "--plain-per-round", str(args.peer_plain_per_round),
           "--models", ",".join(models), "--gpt2", args.gpt2,
           "--threads", str(torch.get_num_threads())]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    print(f"torchlens 2.36.1 peer: {python} ...", flush=True)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=args.peer_timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"peer run exceeded {args.peer_timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"peer run failed (rc {proc.returncode}): {proc.stderr.strip()[-800:]}"}
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------- measurement


def bench_models(tl: Any, args: argparse.Namespace, skip: set[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tl-bench-") as draw_dir:
        for name in args.models:
            print(f"[{name}] building ...", flush=True)
            model, x = build_model(name, gpt2_class=args.gpt2)
            methods, missing = methods_for(tl, model, x, skip, draw_dir)
            errors: dict[str, str] = {}

            def on_error(key: str, err: BaseException, errors: dict = errors,
                         name: str = name) -> None:
                errors[key] = f"{type(err).__name__}: {err}"
                print(f"[{name}] {key} failed: {errors[key]}", flush=True)

            t0 = time.perf_counter()
            gc_runs: dict[str, Any] = {}
            samples = time_rounds(methods, runs=args.runs, warmup=args.warmup, on_error=on_error,
                                  gc_out=gc_runs)
            del methods
            entry: dict[str, Any] = {"methods": {}, "missing": missing, "errors": errors}
            for key, s in samples.items():
                if key not in errors:
                    entry["methods"][key] = summarize(s, gc_runs.get(key))
            try:
                entry.update(op_counts(tl, model, x))
                entry["metadata_bytes"] = metadata_bytes(tl, model, x)
            except Exception as err:
                entry["errors"]["counts"] = f"{type(err).__name__}: {err}"
            print(f"[{name}] timed in {time.perf_counter() - t0:.0f} s", flush=True)
            results[name] = entry
            del model, x
            gc.collect()
    return results


def bench_allocator(args: argparse.Namespace) -> dict[str, Any]:
    """This file again in two child processes, ``ALLOCATOR_METHODS`` on ``ALLOCATOR_MODELS``:
    one with glibc's defaults, one with ``ALLOCATOR_ENV``, so the two differ only in the
    allocator; how much of a capture's cost is fresh pages from the kernel."""
    models = [m for m in ALLOCATOR_MODELS if m in args.models]
    if not models:
        return {}
    skip = [k for k in ROWS if k != "plain" and k not in ALLOCATOR_METHODS]
    runs: dict[str, Any] = {"env": ALLOCATOR_ENV}
    for part, env in (("default", {}), ("no_trim", ALLOCATOR_ENV)):
        print(f"[allocator] {', '.join(models)}, {part} ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="tl-bench-alloc-") as tmp:
            out = Path(tmp) / "alloc.json"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--models", ",".join(models),
                   "--skip", ",".join(skip), "--no-scaling", "--no-allocator",
                   "--runs", str(args.runs), "--warmup", str(args.warmup), "--json", str(out)]
            if args.threads:
                cmd += ["--threads", str(args.threads)]
            proc = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True,
                                  text=True, timeout=1200)
            if proc.returncode != 0 or not out.exists():
                return {"error": f"{part}: exit {proc.returncode}: "
                                 f"{proc.stderr.strip()[-500:]}"}
            child = json.loads(out.read_text(encoding="utf-8"))
        runs[part] = {n: child["models"][n]["methods"] for n in models}
    return runs


def bench_scaling(tl: Any, args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for n_layer in SCALING_LAYERS:
        model, x = build_model("gpt2", gpt2_class=args.gpt2_scaling, n_layer=n_layer)
        methods = {"plain": plain_forward(model, x)}

        def meta(model: torch.nn.Module = model, x: Any = x) -> Any:
            with torch.no_grad():
                return tl.trace(model, x, save=None)

        methods["tl_meta"] = meta
        samples = time_rounds(methods, runs=args.runs, warmup=args.warmup)
        del methods, meta
        counts = op_counts(tl, model, x)
        mem = metadata_bytes(tl, model, x)
        plain_ms = statistics.fmean(samples["plain"]) * 1e3
        meta_ms = statistics.fmean(samples["tl_meta"]) * 1e3
        ops = counts["ops"]
        rows.append({
            "n_layer": n_layer, **counts, "plain_ms": plain_ms, "meta_ms": meta_ms,
            "plain_median_ms": statistics.median(samples["plain"]) * 1e3,
            "meta_median_ms": statistics.median(samples["tl_meta"]) * 1e3,
            "ratio": meta_ms / plain_ms,
            "us_per_op": meta_ms * 1e3 / ops,
            "overhead_us_per_op": (meta_ms - plain_ms) * 1e3 / ops,
            "bytes_per_op": mem["retained"] / ops, "peak_bytes_per_op": mem["peak"] / ops,
            "metadata_bytes": mem,
        })
        print(f"[scaling] n_layer={n_layer}: {ops} ops, {meta_ms:.1f} ms, "
              f"{meta_ms * 1e3 / ops:.1f} us/op, {mem['retained'] / ops:.0f} B/op", flush=True)
        del model, x
        gc.collect()
    per_op = [r["us_per_op"] for r in rows]
    mean = statistics.fmean(per_op)
    for r in rows:
        r["dev_from_mean"] = r["us_per_op"] / mean - 1
    return {"model": f"gpt2 ({args.gpt2_scaling})", "seq_len": 32, "rows": rows,
            "mean_us_per_op": mean,
            "max_abs_dev": max(abs(r["dev_from_mean"]) for r in rows),
            "flat": all(abs(r["dev_from_mean"]) <= TARGET_FLAT for r in rows)}


# ------------------------------------------------------------------------------------- figures


def ratio_table(results: dict[str, Any], peer: dict[str, Any],
                stat: str = "mean_ms") -> dict[str, dict[str, Any]]:
    """{method: {model: ratio or None}} of ``stat``; 2.36.1 against its own plain forward."""
    table: dict[str, dict[str, Any]] = {key: {} for key in ROWS}
    for name, entry in results.items():
        m = entry["methods"]
        plain = m.get("plain", {}).get(stat)
        for key in ROWS:
            if key == "peer_tl":
                p = (peer.get("models") or {}).get(name, {})
                num = (p.get("trace_all") or {}).get(stat)
                den = (p.get("plain_forward") or {}).get(stat)
                table[key][name] = num / den if num and den and not p.get("error") else None
            else:
                num = (m.get(key) or {}).get(stat)
                table[key][name] = num / plain if num and plain else None
    return table


def abs_table(results: dict[str, Any], peer: dict[str, Any],
              stat: str = "mean_ms") -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {key: {} for key in ROWS}
    for name, entry in results.items():
        for key in ROWS:
            if key == "peer_tl":
                p = (peer.get("models") or {}).get(name, {})
                table[key][name] = (p.get("trace_all") or {}).get(stat)
            else:
                table[key][name] = (entry["methods"].get(key) or {}).get(stat)
    return table


def per_op_table(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{model: {"ops", "methods": {method: us_per_op, overhead_us_per_op, vs_bare}}} from the
    means: ``overhead = (method - plain) / ops``, ``vs_bare`` = overhead / the bare mode's."""
    out: dict[str, dict[str, Any]] = {}
    for name, entry in results.items():
        ops, m = entry.get("ops"), entry["methods"]
        plain = (m.get("plain") or {}).get("mean_ms")
        if not ops or plain is None:
            continue
        bare = (m.get("bare") or {}).get("mean_ms")
        bare_over = (bare - plain) * 1e3 / ops if bare is not None else None
        rows: dict[str, Any] = {}
        for key in ROWS:
            mean = (m.get(key) or {}).get("mean_ms")
            if mean is None:
                continue
            over = (mean - plain) * 1e3 / ops
            rows[key] = {"us_per_op": mean * 1e3 / ops, "overhead_us_per_op": over,
                         "vs_bare": over / bare_over if bare_over and bare_over > 0 else None}
        out[name] = {"ops": ops, "bare_calls": entry.get("bare_calls"),
                     "bare_overhead_us_per_op": bare_over, "methods": rows}
    return out


def tl_name(key: str) -> str:
    """``tl.trace(save=None)`` etc.: a torchlens row's label as a call."""
    return "tl." + ROWS[key].removeprefix("torchlens ")


def check(value: float | None, ok: bool) -> str:
    return "n/a" if value is None else ("PASS" if ok else "MISS")


def targets(ratios: dict[str, dict[str, Any]], per_op: dict[str, dict[str, Any]],
            scaling: dict[str, Any] | None, models: list[str]) -> list[dict[str, Any]]:
    """Every verdict, from this run's ratios of means."""
    out = []
    for name, key, limit in TARGET_RATIOS:
        if name in models:
            r = ratios[key].get(name)
            out.append({"target": f"{tl_name(key)} \u2264 {limit:.2f}x "
                                  "plain forward", "model": name, "value": r, "shown": fmt_x(r),
                        "verdict": check(r, r is not None and r <= limit)})
    for name, key, limit in TARGET_BARE:
        if name in models:
            r = ((per_op.get(name) or {}).get("methods", {}).get(key) or {}).get("vs_bare")
            out.append({"target": f"{tl_name(key)}: overhead per op "
                                  f"\u2264 {limit:.2f}x the bare mode's", "model": name, "value": r,
                        "shown": "n/a" if r is None else f"{r:.2f}x bare",
                        "verdict": check(r, r is not None and r <= limit)})
    names, keys = TARGET_VS_TORCHINFO
    for key in keys:
        for name in names:
            if name in models:
                ours, theirs = ratios[key].get(name), ratios["torchinfo"].get(name)
                r = ours / theirs if ours and theirs else None
                out.append({"target": f"{tl_name(key)} \u2264 torchinfo "
                                      "summary (time / time)", "model": name, "value": r,
                            "shown": fmt_x(r), "verdict": check(r, r is not None and r <= 1.0)})
    for name in TARGET_PEER_MODELS:
        if name not in models:
            continue
        ours, theirs = ratios["tl_all"].get(name), ratios["peer_tl"].get(name)
        speedup = theirs / ours if ours and theirs else None
        out.append({"target": f"\u2265 {TARGET_PEER_SPEEDUP:g}x faster than torchlens 2.36.1 trace "
                              "(all activations, ratio / ratio)",
                    "model": name, "value": speedup,
                    "shown": "n/a" if speedup is None else f"{speedup:.1f}x faster",
                    "verdict": check(speedup, speedup is not None
                                     and speedup >= TARGET_PEER_SPEEDUP)})
    if scaling:
        dev = scaling["max_abs_dev"]
        out.append({"target": f"GPT-2 2/4/8/16 layers: capture time per op flat within "
                              f"\u00b1{TARGET_FLAT:.0%} of the mean", "model": scaling["model"],
                    "value": dev, "shown": f"largest deviation {dev:.0%}",
                    "verdict": "PASS" if scaling["flat"] else "MISS"})
    return out


def fmt_x(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def row_label(key: str, versions: dict[str, str]) -> str:
    return ROWS[key].format(v=versions.get(key, "?"))


def cell_ratio(key: str, name: str, ratios: dict, why: dict[str, dict[str, str]]) -> str:
    v = ratios[key].get(name)
    if v is not None:
        return fmt_x(v)
    return why.get(name, {}).get(key, "n/a")


def reasons(results: dict[str, Any], peer: dict[str, Any], skip: set[str]) -> dict:
    """{model: {method: why it has no figure}}."""
    why: dict[str, dict[str, str]] = {}
    for name, entry in results.items():
        w = {k: "skipped" for k in skip}
        w.update(entry.get("missing", {}))
        w.update({k: "error (see JSON)" for k in entry.get("errors", {})})
        if "peer_tl" not in skip:
            if peer.get("error"):
                w["peer_tl"] = "n/a (peer env unavailable)"
            elif (peer.get("models") or {}).get(name, {}).get("error"):
                w["peer_tl"] = "error (see JSON)"
        why[name] = w
    return why


def text_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    fmt_row = lambda r: "  ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([fmt_row(header), line, *(fmt_row(r) for r in rows)])


def md_table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def machine_line(report: dict[str, Any]) -> str:
    m, c = report["machine"], report["config"]
    threads = f"{m['torch_threads']} torch thread" + ("s" if m["torch_threads"] != 1 else "")
    return (f"{m['cpu']}, {m['cores']} cores ({threads}), "
            f"torch {m['torch']}, Python {m['python']}; torchlens-core {c['torchlens']}"
            f"{' @ ' + c['git'] if c.get('git') else ''}; CPU, {c['runs']} runs per method in "
            f"rotating blocks of 5 back-to-back calls ({c['peer_runs']} for torchlens 2.36.1, "
            f"against {c['peer_runs'] * c.get('peer_plain_per_round', 1)} of its plain forward); "
            f"load average "
            f"{m['load_avg_1min']['start']:.1f} -> {m['load_avg_1min']['end']:.1f}")


def per_op_rows(report: dict[str, Any], keys: list[str], models: list[str]) -> list[list[str]]:
    per_op, versions = report["per_op"], report["versions"]
    rows = []
    for k in keys:
        if k == "peer_tl":
            continue
        row = [row_label(k, versions)]
        for n in models:
            f = (per_op.get(n) or {}).get("methods", {}).get(k)
            if f is None:
                row += ["n/a", "n/a"]
                continue
            over = "--" if k == "plain" else f"{f['overhead_us_per_op']:+.2f}"
            if f.get("vs_bare") is not None and k not in ("plain", "plain_again", "bare"):
                over += f" ({f['vs_bare']:.2f}x)"
            row += [f"{f['us_per_op']:.2f}", over]
        rows.append(row)
    return rows


def stat_rows(report: dict[str, Any], keys: list[str], models: list[str],
              cell: Callable[[dict[str, Any]], str | None]) -> list[list[str]]:
    """A row per method of ``cell(its figures)`` per model ("n/a" where ``cell`` gives None);
    a method with no cell at all is left out."""
    rows = []
    for k in keys:
        cells = []
        for n in models:
            text = cell((report["models"].get(n, {}).get("methods") or {}).get(k) or {})
            cells.append("n/a" if text is None else text)
        if any(c != "n/a" for c in cells):
            rows.append([row_label(k, report["versions"]), *cells])
    return rows


def gc_cell(s: dict[str, Any]) -> str | None:
    if "gc_mean_ms" not in s:
        return None
    return f"{s['gc_mean_ms']:.2f} ({s['gc_collections']}/{s['gc_full_collections']})"


def fault_cell(s: dict[str, Any]) -> str | None:
    if "faults_per_call" not in s:
        return None
    return f"{s['faults_per_call']:,.0f} ({s['sys_ms_per_call']:.2f})"


def allocator_rows(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The two allocator children side by side: ratio, faults and kernel ms per call."""
    alloc = report.get("allocator") or {}
    models = list(alloc.get("default", {}))
    header = ["method"] + [f"{n} {part}" for n in models for part in ("default", "no trim")]
    rows = []
    for k in ("plain", *ALLOCATOR_METHODS):
        cells = []
        for n in models:
            for part in ("default", "no_trim"):
                methods = alloc[part][n]
                s, plain = methods.get(k) or {}, methods.get("plain") or {}
                if s.get("mean_ms") is None or not plain.get("mean_ms"):
                    cells.append("n/a")
                    continue
                cells.append(f"{s['mean_ms'] / plain['mean_ms']:.2f}x, "
                             f"{s.get('faults_per_call', 0):,.0f} faults "
                             f"({s.get('sys_ms_per_call', 0):.1f} ms)")
        rows.append([row_label(k, report["versions"]), *cells])
    return header, rows


def render(report: dict[str, Any], markdown: bool) -> str:
    models = report["config"]["models"]
    ratios, medians = report["ratios"], report["ratios_median"]
    why, versions = report["why_missing"], report["versions"]
    keys = [k for k in ROWS if any(ratios[k].get(n) is not None for n in models)
            or any(k in why.get(n, {}) and why[n][k] != "skipped" for n in models)]
    header = ["method", *models]
    ratio_rows = [[row_label(k, versions), *(cell_ratio(k, n, ratios, why) for n in models)]
                  for k in keys]
    median_rows = [[row_label(k, versions), *(cell_ratio(k, n, medians, why) for n in models)]
                   for k in keys]
    abs_rows = [[row_label(k, versions),
                 *(fmt_ms(report["absolute_ms"][k].get(n)) for n in models)] for k in keys]
    abs_med_rows = [[row_label(k, versions),
                     *(fmt_ms(report["absolute_median_ms"][k].get(n)) for n in models)]
                    for k in keys]
    op_models = [n for n in models if n in report["per_op"]]
    op_header = ["method"]
    for n in op_models:
        op_header += [f"{n} \u00b5s/op", f"{n} overhead \u00b5s/op (x bare)"]
    op_rows = per_op_rows(report, keys, op_models)
    ops_line = ", ".join(f"{n} {report['per_op'][n]['ops']}" for n in op_models)
    tgt_header = ["target", "model", "measured", "verdict"]
    tgt_rows = [[t["target"], t["model"], t["shown"], t["verdict"]] for t in report["targets"]]
    table = md_table if markdown else text_table
    mean_note = ("mean of the back-to-back calls (their total time / runs, collector pauses "
                 "included); the targets use these")
    parts = [f"Machine: {machine_line(report)}" + ("." if markdown else ""), ""]
    parts += [f"Ratio to the plain forward (`torch.no_grad()`) of the same process, {mean_note}:",
              "", table(header, ratio_rows), "",
              "The same as a ratio of medians (hides the collector's rare large pauses):", "",
              table(header, median_rows), ""]
    if not markdown:
        parts += ["Absolute mean ms (torchlens 2.36.1 measured in its own process):",
                  table(header, abs_rows), "", "Absolute median ms:", table(header, abs_med_rows),
                  ""]
    if op_rows:
        parts += [f"Per op, from the means (ops: {ops_line}); overhead = (method - plain) / ops, "
                  "and in brackets that overhead over the bare TorchFunctionMode's:", "",
                  table(op_header, op_rows), ""]
    parts += ["Targets (every verdict from this run's means):", "", table(tgt_header, tgt_rows)]
    noise = [f"{n} {fmt_x(ratios['plain_again'].get(n))}" for n in models
             if ratios["plain_again"].get(n) is not None]
    if noise:
        parts += ["", "Noise check: the same plain forward, timed as a method of its own, read "
                      f"{', '.join(noise)} of the plain forward. A verdict closer to its limit "
                      "than that distance from 1.00x is not settled by this run."]
    g_rows = stat_rows(report, keys, models, gc_cell)
    if g_rows:
        parts += ["", "Cyclic collector inside the timed calls: ms per call (collections / of "
                      f"them full, over {report['config']['runs']} runs):", "",
                  table(header, g_rows)]
    f_rows = stat_rows(report, keys, models, fault_cell)
    if f_rows:
        parts += ["", "Minor page faults per timed call, and in brackets the kernel's ms per call "
                      "(getrusage): memory the allocator hands out fresh from the kernel:", "",
                  table(header, f_rows)]
    if (report.get("allocator") or {}).get("no_trim"):
        a_header, a_rows = allocator_rows(report)
        parts += ["", "Allocator attribution: these methods again in two child processes, one "
                      "with glibc's defaults and one with its heap trimming off "
                      f"({ALLOCATOR_ENV_TEXT}); ratio to that process's plain forward, faults "
                      "and kernel ms per call. The targets use the main run above:", "",
                  table(a_header, a_rows)]
    elif (report.get("allocator") or {}).get("error"):
        parts += ["", f"Allocator attribution not measured: {report['allocator']['error']}"]
    sc = report.get("scaling")
    if sc:
        sc_header = ["GPT-2 layers", "ops", "plain ms", "capture ms (save=None)", "ratio",
                     "\u00b5s / op", "vs mean", "overhead \u00b5s / op", "metadata B / op"]
        sc_rows = [[str(r["n_layer"]), str(r["ops"]), f"{r['plain_ms']:.1f}",
                    f"{r['meta_ms']:.1f}", fmt_x(r["ratio"]), f"{r['us_per_op']:.1f}",
                    f"{r['dev_from_mean']:+.0%}", f"{r['overhead_us_per_op']:.1f}",
                    f"{r['bytes_per_op']:,.0f}"] for r in sc["rows"]]
        parts += ["", f"Scaling ({sc['model']}, {sc['seq_len']} tokens, metadata-only capture, "
                      f"means; {sc['mean_us_per_op']:.1f} \u00b5s/op on average, flat within "
                      f"\u00b1{TARGET_FLAT:.0%}: {'yes' if sc['flat'] else 'no'}):", "",
                  table(sc_header, sc_rows)]
    mem_rows = [[n, str(e.get("ops", "?")), f"{e['metadata_bytes']['retained'] / e['ops']:,.0f}",
                 f"{e['metadata_bytes']['peak'] / e['ops']:,.0f}"]
                for n, e in report["models"].items() if e.get("metadata_bytes") and e.get("ops")]
    if mem_rows:
        parts += ["", "Metadata bytes per op of a save=None trace (tracemalloc):", "",
                  table(["model", "ops", "retained B / op", "peak B / op"], mem_rows)]
    peer = report.get("peer") or {}
    if not markdown and peer.get("error"):
        parts += ["", f"torchlens 2.36.1 peer not measured: {peer['error']}"]
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------------------------------ main


def git_rev() -> str | None:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "packages"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (rev + ("+dirty" if dirty else "")) or None


def version_of(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="TorchLens capture overhead benchmark (CPU).")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 3 runs, 1 warm-up, no peers; writes results/quick.*")
    p.add_argument("--runs", type=int, help="timed runs per method (default 40; --quick 3)")
    p.add_argument("--warmup", type=int, help="untimed runs per method first (default 2)")
    p.add_argument("--peer-runs", type=int, default=9, help="runs for torchlens 2.36.1")
    p.add_argument("--peer-warmup", type=int, default=1)
    p.add_argument("--peer-plain-per-round", type=int, default=3,
                   help="plain forwards per torchlens 2.36.1 round (its ratios' denominator)")
    p.add_argument("--peer-timeout", type=int, default=1200, help="seconds for the peer process")
    p.add_argument("--peer-python", help="interpreter with torchlens 2.36.1 (default: the "
                                         "bench-peer hatch env, created when missing)")
    p.add_argument("--skip", default="", help="comma-separated methods not to time: "
                                              + ", ".join(k for k in ROWS if k != "plain"))
    p.add_argument("--no-scaling", action="store_true", help="skip the GPT-2 layer sweep")
    p.add_argument("--no-allocator", action="store_true",
                   help="skip the attribution run with glibc's heap trimming off")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--gpt2", choices=GPT2_CLASSES, default="lm",
                   help="lm: GPT2LMHeadModel (default); base: GPT2Model, no LM head")
    p.add_argument("--gpt2-scaling", choices=GPT2_CLASSES, default="base",
                   help="GPT-2 class of the layer sweep (default base: the stack alone, so the "
                        "LM head's one large matmul does not swamp the per-op figure)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--json", help="write all figures here (default results/latest.json; "
                                  "a .md table is written beside it)")
    args = p.parse_args(argv)
    args.runs = args.runs or (3 if args.quick else 40)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    args.models = [m for m in args.models.split(",") if m]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.quick:
        skip |= set(PEERS)
    unknown = skip - set(ROWS)
    if unknown or "plain" in skip:
        print(f"--skip: unknown or unskippable method(s) {sorted(unknown | (skip & {'plain'}))}",
              file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")

    import torchlens as tl

    json_path = Path(args.json) if args.json else (
        HERE / "results" / ("quick.json" if args.quick else "latest.json"))
    md_path = json_path.with_suffix(".md")
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    if load_start > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {load_start:.1f} on {os.cpu_count()} cores -- other work is "
              "running; timings will be noisy (try --threads 1 on a shared machine)", flush=True)

    results = bench_models(tl, args, skip)
    peer: dict[str, Any] = {}
    if "peer_tl" not in skip:
        peer = run_peer(args, args.models)
        if peer.get("error"):
            print(f"torchlens 2.36.1 peer not measured: {peer['error']}", flush=True)
    scaling = None if args.no_scaling else bench_scaling(tl, args)
    allocator = {} if args.no_allocator or args.quick else bench_allocator(args)

    versions = {"torchinfo": version_of("torchinfo"), "torchview": version_of("torchview"),
                "peer_tl": peer.get("version", "2.36.1")}
    ratios = ratio_table(results, peer)
    report: dict[str, Any] = {
        "machine": machine(),
        "config": {"torchlens": getattr(tl, "__version__", "?"), "git": git_rev(),
                   "models": args.models, "gpt2_class": args.gpt2,
                   "gpt2_scaling_class": args.gpt2_scaling, "runs": args.runs,
                   "warmup": args.warmup,
                   "peer_runs": args.peer_runs, "peer_warmup": args.peer_warmup,
                   "peer_plain_per_round": args.peer_plain_per_round,
                   "quick": args.quick, "skipped": sorted(skip)},
        "versions": versions,
        "models": results,
        "peer": peer,
        "stat": "ratios, targets and per-op figures use mean_ms (total of the back-to-back calls "
                "/ runs); ratios_median and absolute_median_ms use the median",
        "ratios": ratios,
        "ratios_median": ratio_table(results, peer, "median_ms"),
        "absolute_ms": abs_table(results, peer),
        "absolute_median_ms": abs_table(results, peer, "median_ms"),
        "per_op": per_op_table(results),
        "why_missing": reasons(results, peer, skip),
        "scaling": scaling,
        "allocator": allocator,
    }
    report["targets"] = targets(ratios, report["per_op"], scaling, args.models)
    report["elapsed_s"] = time.perf_counter() - started
    report["machine"]["load_avg_1min"] = {"start": load_start, "end": os.getloadavg()[0]}

    print()
    print(render(report, markdown=False))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    md_path.write_text(render(report, markdown=True), encoding="utf-8")
    print(f"wrote {json_path} and {md_path} ({report['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
