"""tl.recording.dry_run: what a selection would record, from one metadata-only capture."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..capture.inference import outside_inference_mode
from ..errors import InputError
from ..ladder import ABSENT
from ..sites import split_pass

SAVE_TEACH = ["tl.record(model, inputs, save=['conv2d_1', 'layer1'])",
              "tl.recording.dry_run(model, x, save=[...])  # see what would be recorded"]


@outside_inference_mode
def dry_run(model: nn.Module, x: Any = ABSENT, /, *, save: list[str], input_shape: Any = None,
            tokenizer: Any = None, processor: Any = None, preprocess: Any = None
            ) -> list[dict[str, Any]]:
    """Which ops ``save=`` would record, with their shapes and bytes per input: one metadata
    capture, no values stored."""
    from ..verbs import trace

    result = trace(model, x, input_shape=input_shape, save=None, tokenizer=tokenizer,
                   processor=processor, preprocess=preprocess)
    rows = []
    for key in save:
        try:
            hit = result[key]
        except KeyError:
            raise InputError(f"save= names {key!r}, which this forward does not have",
                             code="save_selection_invalid", teach=SAVE_TEACH) from None
        if hasattr(hit, "calls"):
            ops = [result[call.output_ops[0]] for call in hit.calls if call.output_ops]
        elif hasattr(hit, "output_ops"):
            ops = [result[hit.output_ops[0]]]
        else:
            ops = [hit] if split_pass(key)[1] is not None else \
                [op for op in result if op.base_label == hit.base_label]
        for op in ops:
            rows.append({"key": key, "label": op.label, "func": op.func, "shape": op.shape,
                         "dtype": op.dtype, "bytes": op.nbytes})
    return rows
