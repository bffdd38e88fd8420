"""Parameters of two traced models, module by module: the same tensors, equal, or how far apart
(a base model against its fine-tuned copy). Read from the live models the traces hold."""

from __future__ import annotations

from typing import Any

from .metrics import value_stats


def _own(model: Any) -> dict[str, dict[str, Any]]:
    """Module address -> its own parameters by local name (modules without any left out)."""
    out: dict[str, dict[str, Any]] = {}
    for address, module in model.named_modules():
        own = {name: p for name, p in module.named_parameters(recurse=False)}
        if own:
            out[address] = own
    return out


def compare_params(a: Any, b: Any) -> list[dict[str, Any]]:
    """One row per module holding parameters in either model; empty when a trace holds no
    model (it was loaded from a file)."""
    ma, mb = a._objects.get("model"), b._objects.get("model")
    if ma is None or mb is None:
        return []
    pa, pb = _own(ma), _own(mb)
    rows = []
    for address in list(pa) + [m for m in pb if m not in pa]:
        x, y = pa.get(address), pb.get(address)
        row: dict[str, Any] = {"module": address, "max_abs": None, "relative": None}
        if x is None or y is None:
            row["status"] = "removed" if y is None else "added"
        elif set(x) != set(y) or any(x[n].shape != y[n].shape for n in x):
            row["status"] = "shapes differ"
        elif all(x[n] is y[n] for n in x):
            row["status"] = "same tensors"
        elif any(x[n].is_meta or y[n].is_meta for n in x):
            row["status"] = "not compared (meta)"
        else:
            stats = [value_stats(x[n].detach(), y[n].detach(), 0.0, 0.0) for n in sorted(x)]
            worst_abs = max(s["max_abs"] for s in stats)
            row["status"] = "equal" if worst_abs == 0 else "differ"
            row["max_abs"], row["relative"] = worst_abs, max(s["relative"] for s in stats)
        rows.append(row)
    return rows
