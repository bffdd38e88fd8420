"""tl.record: the selected ops' activations over one input or a whole dataset.

A light capture labels every op exactly as ``tl.trace`` does but keeps only what ``save=``
selects. Without ``to=`` the values stay in memory; with it they go to a sharded store on disk
that survives a kill, resumes, and is written by every rank of a torchrun job.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..anatomy import NameTaps, has_names, name_sites
from ..capture.engine import capture, parse_save
from ..capture.inference import outside_inference_mode
from ..capture.inventory import Inventory, inventory
from ..capture.meta import refuse_values
from ..capture.seam import CaptureRequest
from ..capture.taps import Taps
from ..compiling import CompiledRun, compile_options
from ..errors import InputError
from ..sites import expand_globs, name_of, transformer_name
from . import distributed, parallel
from .distributed import Ranks
from .dry_run import SAVE_TEACH, dry_run
from .manifest import MANIFEST, RecordingError, header, merge, rank_manifest, read_json, write_json
from .memory import Recording
from .reader import StoredRecording
from .reader import open as open_store
from .rows import Keeper, batch_rows, check_reduce, describe_reduce
from .writer import ShardWriter, prepare

# a shard's size: the last one is written while the caller waits, and two staging sets of it
# stay in memory, so small; large enough that its fsync and manifest rewrite are rare
SHARD_BYTES = 16 << 20


def _is_single(inputs: Any) -> bool:
    """One input (a tensor, args tuple, mapping, string, image) vs an iterable of inputs."""
    if isinstance(inputs, (torch.Tensor, str, bytes, tuple, Mapping)):
        return True
    module = type(inputs).__module__ or ""
    return module.startswith("PIL.") or module.startswith("numpy") or not isinstance(
        inputs, Iterable)


def _is_prompts(inputs: Any) -> bool:
    return isinstance(inputs, list) and bool(inputs) and all(isinstance(v, str) for v in inputs)


def _forwards(items: Iterable, skip: int, batch_size: int, prompts: bool
              ) -> Iterator[tuple[int, Any, int]]:
    """(first input's local index, the value one forward takes, inputs it covers)."""
    items = itertools.islice(items, skip, None) if skip else items
    if not prompts:
        for k, item in enumerate(items, start=skip):
            yield k, item, 1
        return
    chunk: list[str] = []
    k = skip
    for item in items:
        chunk.append(item)
        if len(chunk) == batch_size:
            yield k, chunk, len(chunk)
            k, chunk = k + len(chunk), []
    if chunk:
        yield k, chunk, len(chunk)


def _check_options(save: Any, reduce: Any, dtype: Any, to: Any, batch_size: int) -> None:
    if isinstance(save, str) or not save or not all(isinstance(s, str) for s in save):
        raise InputError("tl.record needs save= as a non-empty list of op labels or module "
                         "addresses", code="save_selection_invalid", teach=SAVE_TEACH)
    check_reduce(reduce, list(save))
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise InputError(f"dtype={dtype!r}: pass a torch dtype such as torch.bfloat16",
                         code="option_invalid",
                         teach=["tl.record(model, inputs, save=[...], to='acts/', "
                                "dtype=torch.bfloat16)"])
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size={batch_size!r}: a positive number of prompts per forward",
                         code="option_invalid", teach=["tl.record(lm, prompts, save=[...], "
                                                       "batch_size=32)"])
    if to is not None and Path(to).exists() and not Path(to).is_dir():
        raise InputError(f"to={os.fspath(to)!r} is a file; a store is a folder",
                         code="option_invalid",
                         teach=["tl.record(model, inputs, save=[...], to='acts/')"])


def _inputs(inputs: Any) -> tuple[Iterable, int | None, bool]:
    """The inputs as an iterable, their count when known, and whether they are prompts."""
    if _is_single(inputs):
        return [inputs], 1, False
    total = len(inputs) if hasattr(inputs, "__len__") else None
    if total == 0:
        raise InputError("tl.record was given no inputs (an empty iterable)",
                         code="inputs_empty",
                         teach=["tl.record(model, loader, save=[...])  # a non-empty DataLoader"])
    if total is None:
        it = iter(inputs)
        first = next(it, _END)
        if first is _END:
            raise InputError("tl.record was given no inputs (the iterator is exhausted)",
                             code="inputs_empty",
                             teach=["tl.record(model, iter(data), save=[...])  # a fresh one"])
        inputs = itertools.chain([first], it)
    return inputs, total, _is_prompts(inputs)


_END = object()


@outside_inference_mode
def record(model: nn.Module, inputs: Any, /, *, save: list[str],
           to: str | os.PathLike | None = None, dtype: torch.dtype | None = None,
           reduce: Any = None, batch_size: int = 1,
           overwrite: bool = False, progress: bool | None = None, shard_bytes: int = SHARD_BYTES,
           tokenizer: Any = None, processor: Any = None, preprocess: Any = None,
           edits: Any = None, generate: Mapping[str, Any] | None = None,
           compile: Any = None) -> Recording | StoredRecording:
    """Record the ``save=`` ops' activations over one input or an iterable of inputs (a
    DataLoader, a list of prompts tokenized ``batch_size`` at a time).

    Without ``to=`` values stay in memory. With ``to=`` they go to a store on disk: one row per
    example, padded tokens dropped, ``dtype`` cast, ``reduce`` ("mean", "last", a callable, or a
    mapping per label) applied inside the forward. The same call again resumes; under torchrun
    each rank records its share. Returns the opened store. Forwards run under ``no_grad``.
    ``edits={site: edit}`` records the edited model (every forward, each edit proven to fire;
    a store's manifest lists them, so a store of other edits refuses to resume).
    ``generate={"max_new_tokens": 16, ...}`` records generations of a Hugging Face model
    (torchlens-hf; prompts, ``batch_size=1``): per prompt one row per token, the prompt's and
    each generated token fed back, with ``generate.step`` (the step that computed it) and
    ``generate.token`` (its id) recorded beside the labels.
    ``compile=True`` (or a mapping of torch.compile's ``backend``, ``mode``, ``dynamic``,
    ``options``, ``fullgraph``, and ``recompile_limit``) records through ``torch.compile``, the
    selected values kept inside the compiled graph; a model already compiled records compiled
    unless ``compile=False``. The first forward is compared with an eager capture (each site's
    largest difference in the manifest's ``compiled`` or ``recording.compiled``).
    A model sharded across processes records whole values: split by tensor, every rank runs
    every input and rank 0 writes; split by data (FSDP2), each rank its share (``parallel``).
    """
    from ..capture.entry import checked_inventory
    from ..edits.plan import plan_edits

    _check_options(save, reduce, dtype, to, batch_size)
    compiling = compile_options(compile, model, "record")
    if compiling is not None:
        if generate is not None:
            raise InputError("compile= records single forwards; a generation's steps run "
                             "eagerly", code="option_invalid",
                             teach=["tl.record(lm, prompts, save=[...], generate={...}, "
                                    "compile=False)"])
    inv = checked_inventory(model, "record")
    refuse_values(model, "record", "recorded activations", inv)
    presplit = distributed.uses_distributed_sampler(inputs)
    split = parallel.how_split(model, compiling=compiling is not None,
                               generate=generate is not None,
                               names=has_names(list(save), edits, inv), presplit=presplit)
    save = expand_globs(list(save), inv.addresses)
    parse_save([s for s in save if not has_names([s], None, inv)], model, inv,
               "record")  # modules now
    named_edits = generate is None and has_names(None, edits, inv)
    plan = None if named_edits else plan_edits(edits, inv, model, False, "record")
    gen = None
    if generate is not None:
        from .generation import GenerateSpec

        gen = GenerateSpec(generate, edits, batch_size, reduce)
    items, total, prompts = _inputs(inputs)
    if named_edits:  # transformer names, bound to the first input's graph (every forward's)
        items, first = _peek(items)
        res = _resolve(model, [first] if prompts else first, options_of(tokenizer, processor,
                                                                        preprocess), inv)
        plan = plan_edits(edits, inv, model, False, "record",
                          named=name_sites(model, res.args, res.kwargs, inv, list(edits)))
    # one input: no code of the caller's runs before its forward, so its walk is this one
    first_inv = inv if _is_single(inputs) else None
    options = options_of(tokenizer, processor, preprocess)
    if progress is None:
        progress = sys.stderr.isatty()
    run = CompiledRun(model, compiling, "record", inv) if compiling is not None else None
    try:
        if to is None:
            return _record_in_memory(model, items, total, prompts, save, reduce, dtype,
                                     batch_size, progress, options, first_inv, plan, gen, run,
                                     split)
        items, first = _peek(items)
        if gen is None and split is None:  # a generation's labels are checked by its first
            # step; a sharded model's by its first capture, on every rank before any row
            _check_labels(model, first, save, options, prompts, inv)
        return _record_to_store(model, items, total, prompts, save, reduce, dtype, batch_size,
                                progress, options, Path(to), overwrite, shard_bytes, presplit,
                                plan, gen, run, split)
    finally:
        if run is not None:
            run.close()


def options_of(tokenizer: Any, processor: Any, preprocess: Any) -> dict[str, Any]:
    """The resolvers an input is resolved with."""
    return {"tokenizer": tokenizer, "processor": processor, "preprocess": preprocess}


def _peek(items: Iterable) -> tuple[Iterable, Any]:
    if isinstance(items, (list, tuple)):
        return items, items[0]
    it = iter(items)
    first = next(it)
    return itertools.chain([first], it), first


def _check_labels(model: nn.Module, first: Any, save: list[str], options: dict,
                  prompts: bool, inv: Inventory) -> None:
    """The dry_run check: op labels the forward does not make refuse before any recording."""
    modules = set(inv.addresses)
    save = [s for s in save if not has_names([s], None, inv)]  # names bind at the capture
    if all(s in modules for s in save):
        return
    dry_run(model, [first] if prompts else first, save=save, **options)


def _resolve(model: nn.Module, value: Any, options: dict, inv: Inventory | None):
    from ..capture.entry import resolve_for

    return resolve_for(model, value, input_kwargs=None, input_shape=None, surface="record",
                       options=options, inv=inv)


def _capture(model: nn.Module, res, save: list[str], keeper: Keeper, plan: Any = None,
             inv: Inventory | None = None, run: CompiledRun | None = None,
             split: str | None = None) -> dict[str, Any]:
    """One light capture; recording needs no autograd graph, so none is built. Transformer
    names among ``save`` are bound to this input's graph (``anatomy.NameTaps``); ``run``
    runs it compiled; a model sharded across processes (``split``) is gathered whole."""
    if split is not None:
        return parallel.capture_whole(model, res, save, keeper, plan, split)
    inv = inv or res.inventory or inventory(model)
    names = NameTaps(model, res.args, res.kwargs, inv, save) if has_names(save, None, inv) \
        else None
    with torch.no_grad():
        taps = Taps(keep=keeper if names is None else names.keep(keeper))
        kept = save if names is None else names.save
        parts = [p for p in (plan, names and names.part) if p is not None]
        runner = run.part(res.args, res.kwargs, kept, parts) if run is not None else None
        capture(CaptureRequest(model, res.args, res.kwargs, save=kept,
                               inventory=res.inventory),
                [*parts, taps] + ([runner] if runner is not None else []))
        if runner is not None:
            run.checked(runner)
        return taps.values if names is None else names.values(taps.values, keeper)


def _missing(values: dict[str, Any], save: list[str]) -> None:
    missing = [s for s in save if transformer_name(s) is None  # (names refuse as they bind)
               and not any(k == s or name_of(k) == s for k in values)]
    if missing:
        raise InputError(f"save= names {missing} that no op or module of this forward matches",
                         code="save_selection_invalid", teach=SAVE_TEACH)


def _bar(progress: bool, total: int | None):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="tl.record", unit="input", dynamic_ncols=True)


def _record_in_memory(model, items, total, prompts, save, reduce, dtype, batch_size, progress,
                      options, inv: Inventory | None, plan: Any = None, gen: Any = None,
                      run: CompiledRun | None = None, split: str | None = None) -> Recording:
    bar = _bar(progress, total)
    batches: list[dict[str, Any]] = []
    provenance: list[dict] = []
    labels: list[str] = []
    try:
        for _, count, res, _, values in _captured(model, items, 0, batch_size, prompts, save,
                                                  reduce, dtype, options, as_rows=False,
                                                  inv=inv, plan=plan, gen=gen, run=run,
                                                  split=split):
            if not batches:
                labels = list(values)
            provenance.append(res.provenance if plan is None else
                              dict(res.provenance, edits=plan.specs()))
            batches.append(values)
            if bar is not None:
                _compiled_postfix(bar, run)
                bar.update(count)
    finally:
        if bar is not None:
            bar.close()
    recording = Recording(labels, batches, provenance)
    recording.compiled = run.describe() if run is not None else None
    return recording


def _compiled_postfix(bar: Any, run: CompiledRun | None) -> None:
    """The first forward's compile time, apart from the throughput the bar shows."""
    if run is not None and run.compiler.calls == 1:
        bar.set_postfix_str(f"compiled in {run.compiler.compile_s:.1f} s", refresh=False)


def _record_to_store(model, items, total, prompts, save, reduce, dtype, batch_size, progress,
                     options, folder: Path, overwrite: bool, shard_bytes: int,
                     presplit: bool, plan: Any = None, gen: Any = None,
                     run: CompiledRun | None = None, split: str | None = None
                     ) -> StoredRecording:
    ranks = distributed.join(model)
    # split by tensor: every rank runs every input, rank 0 alone writes
    writing = Ranks() if split == "tensor" else ranks
    if presplit and total is not None:
        total *= ranks.world
    try:
        mine, interleave = (items, "items") if writing.world == 1 else \
            distributed.share(items, ranks, presplit)
        store_options = {"dtype": None if dtype is None else str(dtype).removeprefix("torch."),
                         "reduce": describe_reduce(reduce),
                         "batch_size": batch_size if prompts else None}
        if plan is not None:
            store_options["edits"] = plan.specs()
        if gen is not None:
            store_options["generate"] = gen.describe()
        if run is not None:
            store_options["compile"] = {"backend": run.compiler.backend,
                                        "mode": run.compiler.mode}
        head = header(model, save, store_options, writing.world)
        if split is not None and ranks.world > 1:
            head["model"] = parallel.fingerprint(model, head["model"])
        if writing is not ranks:
            writer = parallel.on_rank_0(ranks, lambda: ShardWriter(
                folder, head, 0, interleave=interleave, shard_bytes=shard_bytes,
                resume=prepare(folder, head, 0, overwrite)))
        else:
            resume = prepare(folder, head, ranks.rank, overwrite)
            distributed.barrier(ranks)  # rank 0 has cleared the folder when asked to
            writer = ShardWriter(folder, head, ranks.rank, interleave=interleave,
                                 shard_bytes=shard_bytes, resume=resume)
        bar = _bar(progress and ranks.rank == 0, total)
        if bar is not None and writer.items_done:
            bar.update(writer.items_done * writing.world)
        try:
            _fill(model, writer, mine, prompts, save, reduce, dtype, batch_size, options,
                  writing, bar, plan, gen, run, split, ranks)
        except BaseException:
            writer.abandon()  # whole inputs recorded so far are kept
            raise
        finally:
            if bar is not None:
                bar.close()
        writer.close()
        distributed.barrier(ranks)
        if writing.world > 1 and ranks.rank == 0:
            parts = [read_json(folder / rank_manifest(r)) for r in range(ranks.world)]
            write_json(folder / MANIFEST, merge(parts))
        distributed.barrier(ranks)
    finally:
        distributed.leave(ranks)
    return open_store(folder)


def _captured(model, items, skip, batch_size, prompts, save, reduce, dtype, options, *,
              as_rows: bool, inv: Inventory | None = None, plan: Any = None, gen: Any = None,
              run: CompiledRun | None = None, split: str | None = None,
              lockstep: Ranks | None = None
              ) -> Iterator[tuple[int, int, Any, int, dict[str, Any]]]:
    """One light capture a forward, after the first ``skip`` inputs: (first input's local
    index, inputs it covered, the resolution, its rows, the kept values; ``count`` 0 for a
    forward run only to keep pace with the other ranks, ``lockstep``). ``inv``: the model's
    inventory for the first forward, taken with no code run since; later ones walk the model
    again (a lazy module may have materialized)."""
    first = True
    forwards = ((*f, True) for f in _forwards(items, skip, batch_size, prompts)) \
        if lockstep is None else parallel.lockstep(_forwards(items, skip, batch_size, prompts),
                                                    lockstep)
    for k, value, count, written in forwards:
        count = count if written else 0
        if gen is not None:  # one generation: its steps' values as one example's rows
            res, values = gen.record(model, value, save, dtype, as_rows, options)
            yield k, count, res, 1, values
            continue
        res = _resolve(model, value, options, inv)
        inv = None
        n_rows, mask = batch_rows(res.args, res.kwargs)
        values = _capture(model, res, save, Keeper(save, reduce, dtype, mask, as_rows=as_rows),
                          plan, run=run, split=split)
        if first:
            _missing(values, save)
            first = False
        yield k, count, res, n_rows, values


def _fill(model, writer: ShardWriter, mine, prompts, save, reduce, dtype, batch_size, options,
          ranks: Ranks, bar, plan: Any = None, gen: Any = None, run: CompiledRun | None = None,
          split: str | None = None, every: Ranks | None = None) -> None:
    """Record ``mine`` into ``writer``, which writes as rank ``ranks.rank`` of ``ranks.world``;
    split by data (``every``: all the processes), the forwards keep pace across ranks."""
    pace = every if split == "data" and every is not None and every.world > 1 else None
    for k, count, res, n_rows, values in _captured(model, mine, writer.items_done, batch_size,
                                                   prompts, save, reduce, dtype, options,
                                                   as_rows=True, plan=plan, gen=gen, run=run,
                                                   split=split, lockstep=pace):
        if not count:  # run to keep pace with the other ranks' forwards: not written
            continue
        writer.note_provenance(res.provenance, count)
        writer.add(k * ranks.world + ranks.rank, values, [1] * count if prompts else [n_rows])
        if run is not None:
            writer.part["compiled"] = run.describe()
        if bar is not None:
            bar.update(count * ranks.world)
            compiled = f", compiled in {run.compiler.compile_s:.1f} s" if run is not None else ""
            bar.set_postfix_str(f"{writer.rows_seen} rows, "
                                f"{writer.bytes_written / 1e6:.1f} MB{compiled}", refresh=False)


__all__ = ["record", "RecordingError"]
