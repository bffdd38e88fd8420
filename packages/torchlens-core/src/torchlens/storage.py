"""Reading trace files (written by ``tracefile.save_trace``) back into Trace objects.

Loading uses ``torch.load(weights_only=True)``: no code runs. Anything unreadable, truncated or
foreign raises ``trace_file_invalid`` before a Trace is built.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from .errors import TraceFileError, first_line
from .trace import OP_FIELDS, SCHEMA_VERSION, Module, ModuleCall, Op, Trace
from .tracefile import FORMAT


def _invalid(path, why: str) -> TraceFileError:
    return TraceFileError(
        f"{path!s} is not a readable TorchLens trace: {why}",
        teach=["trace.save(path)  # write a trace file", "tl.load(path)  # read one back"],
    )


def load_trace(path: str | os.PathLike) -> Trace:
    """Read a file written by ``Trace.save``; refuse anything else with ``trace_file_invalid``."""
    if not os.path.isfile(path):
        raise _invalid(path, "no such file")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt zip, truncated data, unsafe pickle, not a torch file
        raise _invalid(path, f"{type(exc).__name__}: {first_line(exc, 200)}") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise _invalid(path, "it was not written by Trace.save")
    try:
        meta = json.loads(payload["meta_json"])
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise _invalid(path, f"schema version {meta.get('schema_version')} is not "
                                 f"{SCHEMA_VERSION}")
        return _trace_from(meta, payload["tensors"], set(payload.get("tuple_ops", [])))
    except TraceFileError:
        raise
    except Exception as exc:
        raise _invalid(path, f"inconsistent contents ({type(exc).__name__}: {exc})") from exc


def revive(value: Any) -> Any:
    """A saved value as it was: a nested tensor is put together from its parts."""
    if not isinstance(value, dict):
        return value
    if value["nested"] == "jagged":
        return torch.nested.nested_tensor_from_jagged(value["values"], value["offsets"],
                                                      lengths=value.get("lengths"))
    return torch.nested.as_nested_tensor(value["parts"])


def _trace_from(meta: dict, tensors: dict, tuple_ops: set) -> Trace:
    ops = []
    for row in meta["ops"]:
        fields = {name: row[name] for name in OP_FIELDS}
        index = row["index"]
        if row["saved"]:
            if index in tuple_ops:
                n = sum(1 for key in tensors if key.startswith(f"{index}."))
                fields["_value"] = tuple(revive(tensors[f"{index}.{j}"]) for j in range(n))
            else:
                fields["_value"] = revive(tensors[str(index)])
        ops.append(Op(**fields))
    modules = {}
    for m in meta["modules"]:
        calls = [ModuleCall(c["address"], c["pass_num"], c["type"], c["ops"], c["output_ops"],
                            c["time_ns"], positions=c["positions"]) for c in m["calls"]]
        modules[m["address"]] = Module(m["address"], m["type"], m["depth"], m["num_params"],
                                       calls)
    return Trace(ops, modules, meta["params"], meta["buffers"], meta["output_structure"],
                 meta["meta"], provenance=meta["provenance"], annotations=meta["annotations"])
