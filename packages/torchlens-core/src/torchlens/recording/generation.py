"""``tl.record(lm, prompts, generate={...}, save=[...])``: each prompt generated with
``tl.generate`` (torchlens-hf) and recorded as one example whose rows are its tokens: the
prompt's (the prefill) and every generated token fed back (one decoding step each; the last
token chosen is fed to no step, so it has no row). Beside the labels, ``generate.step`` (the
step that computed the row) and ``generate.token`` (the row's token id) are recorded, so the
store, its resume and torchrun are those of any recording."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import InputError
from ..units import format_shape
from ..verbs import generator
from .rows import Keeper, Rows

COLUMNS = ("generate.step", "generate.token")


class _Resolution:
    """What the recording loop reads of an input's resolution: its provenance."""

    def __init__(self, provenance: dict[str, Any]):
        self.provenance = provenance


class GenerateSpec:
    """``generate=``'s options, checked before any forward."""

    def __init__(self, options: Any, edits: Any, batch_size: int, reduce: Any):
        if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
            raise InputError(f"generate= takes lm.generate's keywords as a mapping, not "
                             f"{options!r}", code="option_invalid",
                             teach=['tl.record(lm, prompts, generate={"max_new_tokens": 16}, '
                                    'save=[...])'])
        if batch_size != 1 or reduce is not None:
            raise InputError("a generation is recorded one prompt at a time, a row per token: "
                             "batch_size=1 and no reduce=", code="option_invalid",
                             teach=['tl.record(lm, prompts, generate={"max_new_tokens": 16}, '
                                    'save=[...], batch_size=1)'])
        generate = generator(teach=["pip install torchlens-hf"])
        self.generate, self.options, self.edits = generate, dict(options), edits

    def describe(self) -> dict[str, Any]:
        """What a store's manifest keeps (a store of other options refuses to resume)."""
        return {k: v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)
                for k, v in sorted(self.options.items())}

    def record(self, model: Any, prompt: Any, save: list[str], dtype: Any, as_rows: bool,
               options: dict[str, Any]) -> tuple[_Resolution, dict[str, Any]]:
        """One prompt's generation: {label or column: its rows (or batched values)}."""
        run = self.generate(model, prompt, save=save, edits=self.edits,
                            tokenizer=options.get("tokenizer"), **self.options)
        steps = run.captured
        traces = [run[i] for i in steps]
        # a decoding step's row is its last position (all it computes with a KV cache; without
        # one it recomputes the whole sequence, whose earlier rows are the steps before)
        per_step = {entry: [_first(t, entry) if k == 0 else _first(t, entry)[:, -1:]
                            for k, t in enumerate(traces)] for entry in save}
        counts = [v.shape[1] for v in per_step[save[0]]]
        prompt_len = counts[0]
        ids = run.output_ids[0, :prompt_len + len(steps) - 1].to(torch.long)
        step_of = torch.cat([torch.full((n,), i, dtype=torch.long)
                             for i, n in zip(steps, counts)])
        length = int(step_of.shape[0])
        keeper = Keeper(save, None, dtype, torch.ones(1, length, dtype=torch.long),
                        as_rows=as_rows)
        values = {entry: keeper(entry, torch.cat(parts, dim=1))
                  for entry, parts in per_step.items()}
        for column, value in zip(COLUMNS, (step_of, ids)):
            values[column] = Rows(value, torch.tensor([length])) if as_rows else value[None]
        return _Resolution(run.provenance), values


def _first(trace: Any, site: str) -> torch.Tensor:
    target = trace[site]
    holder = target.calls[0] if hasattr(target, "calls") else target
    value = holder.out
    value = value[0] if isinstance(value, tuple) else value
    if value.dim() < 2:
        raise InputError(f"{site!r} has shape {format_shape(value.shape)}: a generation's rows are "
                         "per token, so a site needs (batch, tokens, ...)",
                         code="recording_value_unsupported",
                         teach=["tl.record(lm, prompts, generate={...}, save=["
                                "'transformer.h.0'])"])
    return value
