"""A capture on a GPU, checked in one short run: no synchronization per op, the same trace as on
the CPU, op times disclosed as host (launch) times, the pinned surfaces' CUDA RNG left as found,
and the capture's cost against a launch-bound forward.

On a machine with CUDA, from the repository root (nothing to install where torch, pluggy, tqdm,
torchvision and transformers are present)::

    PYTHONPATH=packages/torchlens-core/src python3 benchmarks/gpu_check.py --json out.json

``--device cpu`` runs the same checks without a GPU (the sync count is then n/a): the harness
itself, anywhere. Models: tinyops, resnet18, GPT-2 (those whose packages import), built on the
CPU under a fixed seed and copied to the device, TF32 off.

1. syncs: each surface runs once (after a warm call) under
   ``torch.cuda.set_sync_debug_mode("warn")``; counted are the synchronizing calls it makes
   beyond the plain forward's. ``tl.trace`` and ``tl.record`` may add none; the pinned surfaces
   (``tl.summary``, ``tl.draw``'s capture) at most ``PINNED_SYNCS`` (the receipt compares the
   buffers once), whatever the number of ops.
2. identity: ``tl.trace(save="all")`` of the model on the device against that of the same model
   on the CPU: every op row, module call, parameter and buffer with devices and times left out
   (``compare_traces``' canonical form), and every saved value close (``VALUE_RTOL``).
3. op_time: ``trace.meta["op_time"]`` says launch time on CUDA.
4. rng: ``tl.summary`` of a forward that draws random numbers on the device leaves the
   device's generator as it found it.
5. surfaces: a ``save="all"`` trace saved and loaded (every value back on the CPU, equal), a
   ``tl.record`` of two inputs to disk (each row the trace's value) and
   ``validate_forward_pass`` replaying every op on the device.
6. timing: ``run.py``'s methods (plain forward, bare mode, trace, record, summary, draw's
   capture), each call ending in ``torch.cuda.synchronize()``: ratios of means to the plain
   forward, µs per op and the issue's targets, reported, not judged.

Exit status 1 when a check of 1-5 fails.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from _common import MODELS, build_model, call, machine, summarize, time_rounds  # noqa: E402
from compare_traces import canonical_trace, diff, saved_values, tensors_in  # noqa: E402
from run import (  # noqa: E402
    ROWS,
    TARGET_BARE,
    TARGET_RATIOS,
    draw_capture,
    methods_for,
    op_counts,
    per_op_table,
    ratio_table,
    record_labels,
)

PINNED_SYNCS = 4  # the receipt's buffer comparison, once per dtype and device
VALUE_RTOL, VALUE_ATOL = 1e-3, 1e-5
TIMED = ("plain", "plain_again", "bare", "tl_meta", "tl_all", "tl_engine", "tl_record",
         "tl_summary", "tl_draw_capture")
SYNC_TEXT = "synchronizing CUDA operation"
SHOWN = 8
CHECKS = ("syncs", "identity", "op_time", "surfaces")


def to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def synced(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    """``fn`` followed by waiting for the device: a call's whole cost, kernels included."""
    if device.type != "cuda":
        return fn

    def run() -> Any:
        out = fn()
        torch.cuda.synchronize(device)
        return out

    return run


def sync_count(fn: Callable[[], Any], device: torch.device) -> int | None:
    """The synchronizing CUDA calls one call of ``fn`` makes (None off CUDA)."""
    if device.type != "cuda":
        return None
    fn()  # warm: one-time setup may synchronize
    torch.cuda.synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum(SYNC_TEXT in str(w.message) for w in caught)


def check_syncs(tl: Any, model: torch.nn.Module, x: Any, device: torch.device,
                labels: list[str]) -> dict[str, Any]:
    surfaces: dict[str, Callable[[], Any]] = {
        "plain": lambda: call(model, x),
        "tl.trace(save=None)": lambda: tl.trace(model, x, save=None),
        'tl.trace(save="all")': lambda: tl.trace(model, x, save="all"),
        "tl.record(4 labels)": lambda: tl.record(model, x, save=labels, progress=False),
        "tl.summary": lambda: tl.summary(model, x),
        "tl.draw: capture": draw_capture(model, x),
    }
    with torch.no_grad():
        return sync_verdict({name: sync_count(fn, device) for name, fn in surfaces.items()})


def sync_verdict(counts: dict[str, int | None]) -> dict[str, Any]:
    """Each surface's synchronizing calls beyond the plain forward's, against what it may add."""
    if counts["plain"] is None:
        return {"counts": counts, "ok": True, "note": "n/a: not on CUDA"}
    extra = {name: n - counts["plain"] for name, n in counts.items() if name != "plain"}
    bad = {name: n for name, n in extra.items()
           if n > (PINNED_SYNCS if name in ("tl.summary", "tl.draw: capture") else 0)}
    return {"counts": counts, "extra": extra, "ok": not bad, "failed": bad}


def without_devices(value: Any) -> Any:
    """A canonical trace with every ``device`` entry left out (CPU and CUDA differ there)."""
    if isinstance(value, dict):
        return {k: without_devices(v) for k, v in value.items() if k != "device"}
    if isinstance(value, list):
        return [without_devices(v) for v in value]
    return value


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not (a.is_floating_point() or a.is_complex()):
        return torch.equal(a, b)
    return torch.allclose(a, b, rtol=VALUE_RTOL, atol=VALUE_ATOL, equal_nan=True)


def equal(a: Any, b: Any) -> bool:
    """The same tensors (in the same nesting), compared on the CPU element for element."""
    ta, tb = [t for _, t in tensors_in(a, "")], [t for _, t in tensors_in(b, "")]
    return len(ta) == len(tb) and all(x.dtype == y.dtype and torch.equal(x.cpu(), y.cpu())
                                      for x, y in zip(ta, tb))


def check_identity(tl: Any, cpu_model: torch.nn.Module, cpu_x: Any, model: torch.nn.Module,
                   x: Any) -> dict[str, Any]:
    with torch.no_grad():
        ref, got = tl.trace(cpu_model, cpu_x, save="all"), tl.trace(model, x, save="all")
    lines = list(diff(without_devices(canonical_trace(ref)),
                      without_devices(canonical_trace(got)), names=("cpu", "device")))
    ref_values = dict(tensors_in(saved_values(ref), "values"))
    got_values = dict(tensors_in(saved_values(got), "values"))
    lines += [f"{path}: only on the {'cpu' if path in ref_values else 'device'}"
              for path in ref_values.keys() ^ got_values.keys()]
    lines += [f"{path}: values differ beyond rtol {VALUE_RTOL}" for path in ref_values
              if path in got_values and not close(ref_values[path], got_values[path].cpu())]
    return {"ops": len(got), "values": len(got_values), "ok": not lines,
            "differences": len(lines), "shown": lines[:SHOWN],
            "op_time": got.meta.get("op_time")}


class Noisy(torch.nn.Module):
    """A forward that draws from the device's random generator."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + torch.randn_like(x)


def rng_state(device: torch.device) -> torch.Tensor:
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else torch.get_rng_state()


def check_rng(tl: Any, device: torch.device) -> dict[str, Any]:
    """``tl.summary`` of a forward that draws random numbers on the device leaves the device's
    generator as it found it (the plain forward moves it: the check can fail)."""
    model, x = Noisy().to(device), torch.randn(1, 8, device=device)
    before = rng_state(device)
    with torch.no_grad():
        model(x)
    draws = not torch.equal(before, rng_state(device))
    before = rng_state(device)
    tl.summary(model, x)
    kept = torch.equal(before, rng_state(device))
    return {"ok": draws and kept, "forward_draws": draws, "summary_kept": kept}


def check_surfaces(tl: Any, model: torch.nn.Module, x: Any, labels: list[str]) -> dict[str, Any]:
    """What reads device memory back: a trace saved and loaded (values on the CPU, exactly the
    saved ones), forward validation replaying every op on the device, and a record of two
    inputs to disk (each row the trace's value)."""
    from torchlens.validation import validate_forward_pass

    failed: list[str] = []
    with torch.no_grad():
        trace = tl.trace(model, x, save="all")
    with tempfile.TemporaryDirectory(prefix="tl-gpu-") as folder:
        trace.save(Path(folder) / "trace.tl")
        loaded = tl.load(Path(folder) / "trace.tl")
        failed += [f"load: {op.label} differs" for op, back in zip(trace.ops, loaded.ops)
                   if op.saved and not (back.saved and equal(op.out, back.out))]
        rec = tl.record(model, [x, x], save=labels, to=Path(folder) / "acts", progress=False)
        failed += [f"record: {label} row {i} differs" for label in labels for i in (0, 1)
                   if not equal(rec[label].row(i), trace[label].out[0])]
    report = validate_forward_pass(model, x)
    if not report.passed:
        failed.append(f"validate_forward_pass: {report!r}"[:300])
    return {"ok": not failed, "failed": failed[:SHOWN]}


def picked_labels(tl: Any, model: torch.nn.Module, x: Any) -> dict[str, Any]:
    """The labels ``run.py`` times ``tl.record`` with, as a check's result."""
    return {"ok": True, "labels": record_labels(tl, model, x)}


def timing(tl: Any, model: torch.nn.Module, x: Any, device: torch.device,
           runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tl-gpu-") as draw_dir:
        methods, _ = methods_for(tl, model, x, set(ROWS) - set(TIMED), draw_dir)
        methods = {k: synced(fn, device) for k, fn in methods.items()}
        errors: dict[str, str] = {}
        samples = time_rounds(methods, runs=runs, warmup=2, on_error=lambda k, e: errors.update(
            {k: f"{type(e).__name__}: {e}"}))
    entry: dict[str, Any] = {"methods": {k: summarize(s) for k, s in samples.items() if s},
                             "errors": errors}
    entry.update(op_counts(tl, model, x))
    entry["ok"] = not errors
    return entry


def guarded(check: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``check(*args)``, or a failed check holding the error: one broken check must not cost a
    session's device time for the others."""
    try:
        return check(*args)
    except Exception:
        return {"ok": False, "error": traceback.format_exc(limit=6)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--runs", type=int, default=20, help="timed calls per method")
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    if set(args.models) - set(MODELS):
        p.error(f"--models: unknown {sorted(set(args.models) - set(MODELS))}; known: {MODELS}")
    device = torch.device(args.device)
    if device.type == "cuda":  # values comparable with the CPU's
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = check_models(args, device)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    print("ALL CHECKS PASS" if report["ok"] else "A CHECK FAILED")
    return 0 if report["ok"] else 1


def check_models(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    import torchlens as tl

    report: dict[str, Any] = {"machine": machine(), "device": str(device), "models": {}}
    if device.type == "cuda":
        report["gpu"] = torch.cuda.get_device_name(device)
    report["rng"] = guarded(check_rng, tl, device)
    print(f"rng: {report['rng']}", flush=True)
    ok = report["rng"]["ok"]
    for name in args.models:
        try:
            cpu_model, cpu_x = build_model(name)
        except ImportError as err:
            report["models"][name] = {"skipped": f"not importable: {err}"}
            print(f"[{name}] skipped: {err}", flush=True)
            continue
        model, x = copy.deepcopy(cpu_model).to(device), to_device(cpu_x, device)
        labels = guarded(picked_labels, tl, model, x).get("labels", [])
        entry = {
            "syncs": guarded(check_syncs, tl, model, x, device, labels),
            "identity": guarded(check_identity, tl, cpu_model, cpu_x, model, x),
            "surfaces": guarded(check_surfaces, tl, model, x, labels),
        }
        op_time = entry["identity"].get("op_time") or ""
        entry["op_time"] = {"ok": device.type != "cuda" or "launch time" in op_time,
                            "text": op_time}
        entry["timing"] = guarded(timing, tl, model, x, device, args.runs)
        passed = all(entry[k]["ok"] for k in CHECKS)
        ok &= passed
        report["models"][name] = entry
        print(f"[{name}] checks {'PASS' if passed else 'FAIL'}:", flush=True)
        for key in (*CHECKS, "timing"):
            print(f"    {key}: " + ("ok" if entry[key]["ok"] and key == "timing" else
                                    str({k: v for k, v in entry[key].items() if k != "methods"})),
                  flush=True)
        del model, x, cpu_model, cpu_x
    timed = {n: e["timing"] for n, e in report["models"].items() if e.get("timing", {}).get("ok")}
    ratios, per_op = ratio_table(timed, {}), per_op_table(timed)
    report["ratios"], report["per_op"] = ratios, per_op
    report["targets"] = [
        {"model": n, "method": k, "limit": limit, "value": ratios[k].get(n)}
        for n, k, limit in TARGET_RATIOS if n in timed
    ] + [{"model": n, "method": k, "limit_vs_bare": limit,
          "value": per_op.get(n, {}).get("methods", {}).get(k, {}).get("vs_bare")}
         for n, k, limit in TARGET_BARE if n in timed]
    for name in timed:
        row = "  ".join(f"{k} {ratios[k][name]:.2f}x" for k in TIMED
                        if ratios.get(k, {}).get(name) is not None)
        print(f"[{name}] {per_op.get(name, {}).get('ops')} ops; {row}")
        for k, r in (per_op.get(name) or {}).get("methods", {}).items():
            vs = f" ({r['vs_bare']:.2f}x bare)" if r["vs_bare"] is not None else ""
            print(f"    {k}: {r['us_per_op']:.2f} us/op, overhead {r['overhead_us_per_op']:.2f}"
                  f"{vs}")
    report["ok"] = ok
    return report


if __name__ == "__main__":
    raise SystemExit(main())
