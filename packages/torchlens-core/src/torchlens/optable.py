"""The op table of a Trace: ``str(trace)``, the notebook HTML (``_repr_html_``) and pandas rows.

One row per op: label, function, module, output shape, parameters consumed, FLOPs and measured
time; an op an edit changed says EDITED beside its label (``edited`` in the frame). A long trace
shows its first and last ``EDGE`` ops with a count of the ops between (and the edited ones
among them). This module reads a Trace's public fields only and imports nothing from
``trace.py``.
"""

from __future__ import annotations

import html
from typing import Any

from .errors import pandas_for
from .units import format_shapes, human

HEADERS = ("#", "Label", "Function", "Module", "Output shape", "Params", "FLOPs", "Time (ms)")
EDGE = 15  # rows shown at each end of a trace longer than 2 * EDGE + 1 ops
TIME_NOTE = ("Time: measured wall time of each call during this capture (capture overhead "
             "included; a first call may carry one-time setup)")


def _numels(trace: Any) -> dict[str, int]:
    """Parameter and buffer sizes by every name they go by (tied aliases included)."""
    sizes = {}
    for table in (trace.params, trace.buffers):
        for name, info in table.items():
            for alias in [name, *info.get("aliases", ())]:
                sizes[alias] = info.get("numel", 0)
    return sizes


def _params(op: Any, sizes: dict[str, int]) -> int:
    return sum(sizes.get(name, 0) for name in op.params or ())


def _shape(op: Any) -> str:
    shapes = op.out_shapes or ([op.shape] if op.shape is not None else [])
    text = format_shapes(shapes, most=2)
    sharded = (op.meta or {}).get("sharded")  # a model sharded across processes: the whole
    if sharded and isinstance(sharded.get("placement"), list):  # shape, and how it is split
        text += f" {', '.join(sharded['placement'])}"
    return text


def _edited(trace: Any) -> set[str]:
    """The labels of the ops an edit fired at (``trace.edits``, forward and gradient)."""
    return {row["label"] for row in trace.edits if row["fired"]}


def cells(op: Any, sizes: dict[str, int], edited: set[str] = frozenset()) -> list[str]:
    """One op as the table's text cells."""
    module = op.module or ("<model>" if op.kind == "op" else "")
    params = _params(op, sizes)
    time = f"{op.time_ns / 1e6:.3f}" if op.kind == "op" else "--"
    label = f"{op.label} EDITED" if op.label in edited else op.label
    return [str(op.index), label, op.func, module, _shape(op),
            f"{params:,}" if params else "--", human(op.flops), time]


def _shown(ops: list) -> tuple[list, list, int]:
    """The head and tail rows to show, and how many ops lie between them."""
    if len(ops) <= 2 * EDGE + 1:
        return ops, [], 0
    return ops[:EDGE], ops[-EDGE:], len(ops) - 2 * EDGE


def _hidden_edits(trace: Any, edited: set[str]) -> str:
    """``, EDITED among them: dropout_3`` for edited ops the elided middle hides."""
    ops = trace.ops[EDGE:-EDGE]
    names = [op.label for op in ops if op.label in edited] if edited else []
    if not names:
        return ""
    return ", EDITED among them: " + ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")


def _title(trace: Any) -> str:
    n_ops = sum(op.kind == "op" for op in trace.ops)
    origin = trace.provenance.get("origin", "gold")
    return (f"Trace of {trace.meta.get('model_class', 'model')}: {n_ops} ops, "
            f"{trace.num_params:,} params, FLOPs {human(trace.total_flops)}, input {origin}"
            f"{trace._edited_note()}")


def text(trace: Any) -> str:
    """The table ``str(trace)`` prints."""
    sizes, edited = _numels(trace), _edited(trace)
    head, tail, hidden = _shown(trace.ops)
    rows = [list(HEADERS)] + [cells(op, sizes, edited) for op in head + tail]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADERS))]
    right = {0, 5, 6, 7}

    def line(r: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    rule = "-" * (sum(widths) + 2 * (len(widths) - 1))
    lines = [_title(trace), line(rows[0]), rule] + [line(r) for r in rows[1:len(head) + 1]]
    if hidden:
        lines.append(f"... {hidden:,} more ops{_hidden_edits(trace, edited)} (trace.to_pandas() or "
                     "trace.rows() for all) ...")
        lines += [line(r) for r in rows[len(head) + 1:]]
    total_ms = sum(op.time_ns for op in trace.ops) / 1e6
    lines += [rule, f"{len(trace.ops):,} rows; measured op time {total_ms:.2f} ms", TIME_NOTE]
    return "\n".join(lines)


def to_html(trace: Any) -> str:
    """The same table as HTML, for notebooks."""
    esc = html.escape
    sizes, edited = _numels(trace), _edited(trace)
    head, tail, hidden = _shown(trace.ops)
    header = "".join(f"<th>{esc(h)}</th>" for h in HEADERS)

    def row(op: Any) -> str:
        return "<tr>" + "".join(f"<td>{esc(c)}</td>" for c in cells(op, sizes, edited)) + "</tr>"

    body = "".join(row(op) for op in head)
    if hidden:
        body += (f"<tr><td colspan='{len(HEADERS)}'><i>... {hidden:,} more ops"
                 f"{esc(_hidden_edits(trace, edited))} ...</i>"
                 "</td></tr>") + "".join(row(op) for op in tail)
    return (f"<div><p><b>{esc(_title(trace))}</b></p><table><thead><tr>{header}</tr></thead>"
            f"<tbody>{body}</tbody></table><p><small>{esc(TIME_NOTE)}</small></p></div>")


def to_pandas(trace: Any):
    """One row per op (every plain field of ``Op``, plus ``num_params`` and ``edited``: an edit
    fired there), in execution order."""
    pandas = pandas_for("trace.to_pandas()", "trace.rows()  # the same rows as plain dicts")
    sizes, edited = _numels(trace), _edited(trace)
    rows = [{**op.row(), "num_params": _params(op, sizes), "edited": op.label in edited}
            for op in trace.ops]
    return pandas.DataFrame(rows)
