"""``trace.grads``: one row per site and tensor whose gradient ``trace.backward`` computed."""

from __future__ import annotations

from typing import Any

from ..capabilities import provide
from ..errors import pandas_for
from ..trace import NO_GRAD
from ..units import format_shape


class GradTable(list):
    """Rows (dicts): label, module, shape, norm and max abs of the gradient; empty before
    ``trace.backward``."""

    @classmethod
    def of(cls, trace: Any) -> GradTable:
        """The table of a trace's gradients after ``trace.backward``."""
        rows = []
        for op in trace.ops:
            grad = op._grad
            if grad is None:
                continue
            if grad is NO_GRAD:
                rows.append({"label": op.label, "module": op.module, "shape": op.shape,
                             "norm": None, "max_abs": None, "note": "needs no gradient"})
                continue
            for g in grad if isinstance(grad, tuple) else (grad,):
                g64 = g.detach().double()
                rows.append({"label": op.label, "module": op.module, "shape": list(g.shape),
                             "norm": float(g64.norm()),
                             "max_abs": float(g64.abs().max()) if g.numel() else 0.0,
                             "note": ""})
        return cls(rows)

    def __str__(self) -> str:
        if not self:
            return "no gradients (run trace.backward(target) on a save_grads= trace)"
        head = ("label", "module", "shape", "grad norm", "max abs")
        lines = [head] + [(r["label"], r["module"] or "<model>",
                           format_shape(r["shape"]),
                           "-" if r["norm"] is None else f"{r['norm']:.4g}",
                           r["note"] or f"{r['max_abs']:.4g}") for r in self]
        widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
        return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip()
                         for line in lines)

    def __repr__(self) -> str:
        return f"<GradTable: {len(self)} gradient(s)>\n{self}"

    def to_pandas(self):
        """The rows as a pandas frame."""
        return pandas_for("trace.grads.to_pandas()", "list(trace.grads)  # the same rows"
                          ).DataFrame(list(self))


@provide("grads")
def grad_table(trace: Any) -> GradTable:
    """``trace.grads``: the table of its gradients."""
    return GradTable.of(trace)
