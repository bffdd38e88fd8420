"""Writing a trace file: one ``torch.save`` zip of versioned JSON metadata and the saved tensors.

The writer reads a Trace's public fields and imports nothing from ``trace.py``, so the Trace can
save itself without a circle; ``storage.py`` reads the files back into Trace objects.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

FORMAT = "torchlens-trace"


def _meta_of(trace: Any, schema_version: int) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "schema_version": schema_version,
        "ops": [op.row() for op in trace.ops],
        "modules": [m.row() for m in trace.modules.values()],
        "params": trace.params,
        "buffers": trace.buffers,
        "output_structure": trace.output_structure,
        "meta": trace.meta,
        "provenance": trace.provenance,
        "annotations": trace.annotations,
    }


def save_trace(trace: Any, path: str | os.PathLike, schema_version: int) -> None:
    """Write ``trace`` to ``path`` atomically (a temp file renamed into place)."""
    tensors: dict[str, Any] = {}
    for op in trace.ops:
        if op.saved:
            value = op._value
            if isinstance(value, tuple):
                for j, t in enumerate(value):
                    tensors[f"{op.index}.{j}"] = _plain(t)
            else:
                tensors[str(op.index)] = _plain(value)
    _unshare_across_dtypes(tensors)
    payload = {"format": FORMAT, "meta_json": json.dumps(_meta_of(trace, schema_version)),
               "tensors": tensors,
               "tuple_ops": [op.index for op in trace.ops if op.saved
                             and isinstance(op._value, tuple)]}
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    """A tensor subclass's value as a plain tensor on the same memory: ``tl.load`` reads files
    with ``weights_only=True``, which refuses classes it does not know. A nested tensor is
    written as its parts (``storage.revive`` puts it together again)."""
    if isinstance(value, torch.Tensor) and value.is_nested:
        if value.layout == torch.jagged:
            parts = {"values": value.values(), "offsets": value.offsets()}
            if value.lengths() is not None:
                parts["lengths"] = value.lengths()
            return {"nested": "jagged", **parts}
        return {"nested": "strided", "parts": list(value.unbind())}
    if isinstance(value, torch.Tensor) and type(value) is not torch.Tensor:
        return value.as_subclass(torch.Tensor)
    return value


def _unshare_across_dtypes(tensors: dict[str, Any]) -> None:
    """A saved view keeps sharing memory with the value it views, but ``torch.save`` refuses one
    storage seen as two dtypes (``fft(x).real``, ``view_as_real``, ``x.view(torch.int32)``):
    such a view is written as a copy of its own."""
    dtypes: dict[int, torch.dtype] = {}
    for key, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.is_meta or t.layout != torch.strided:
            continue  # (a sparse tensor has no one storage to share)
        storage = t.untyped_storage().data_ptr()
        if dtypes.setdefault(storage, t.dtype) != t.dtype:
            tensors[key] = t.clone()
