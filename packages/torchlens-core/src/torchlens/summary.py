"""tl.summary's result: a module-tree table with shapes, parameters, FLOPs/MACs and measured time,
the totals, the input provenance at the top and the state receipt at the bottom."""

from __future__ import annotations

import html
from typing import Any

from .errors import TorchLensError
from .sites import name_of
from .trace import Trace
from .units import format_shape, format_shapes, human

COLUMNS = ("layer", "type", "output_shape", "params", "params_pct", "flops", "macs", "time_ms")
HEADERS = ("Layer (type)", "Output shape", "Params", "% params", "FLOPs", "MACs", "Time (ms)")


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


def describe_provenance(prov: dict[str, Any]) -> str:
    """One line saying where the input came from."""
    origin = prov.get("origin", "gold")
    slots = prov.get("slots") or []
    parts = []
    for s in slots[:4]:
        shape = format_shape(s["shape"]) if s.get("shape") else s.get("kind", "?")
        parts.append(f"{s.get('slot')}: {shape} {s.get('dtype') or ''} ({s.get('recipe')})"
                     .replace("  ", " "))
    what = "; ".join(parts) or "no tensors"
    if origin == "gold":
        resolver = prov.get("resolver") or {}
        via = f" via {resolver.get('plugin')}" if resolver.get("plugin") else ""
        return f"Input: gold (your real input{via}) - {what}"
    if origin == "declared":
        return f"Input: declared (input_shape=, synthesized seed-0 values) - {what}"
    probes = len(prov.get("probe_diary") or [])
    return f"Input: inferred ({probes} probe(s), synthesized seed-0 values) - {what}"


class Summary:
    """The module tree of one metadata-only, pinned capture, with totals and a receipt."""

    def __init__(self, trace: Trace, depth: int | None = 3, ops: bool = False,
                 grads: Trace | None = None):
        self.trace = trace
        self.grads = grads  # the backward's trace of ``grads=``: a gradient norm per call
        self.depth = depth
        self.provenance = trace.provenance
        self.receipt = trace.receipt
        self.rows = self._rows(ops)
        if grads is not None:
            self._add_grad_norms()
        self.totals = self._totals()

    # ---- building --------------------------------------------------------------------------
    def _rows(self, with_ops: bool) -> list[dict[str, Any]]:
        trace, depth = self.trace, self.depth
        total = trace.num_params or 1
        direct: dict[str, int] = {}
        tied: dict[str, int] = {}
        for info in trace.params.values():
            direct[info["module"]] = direct.get(info["module"], 0) + info["numel"]
            for alias in info["aliases"]:
                owner = alias.rpartition(".")[0]
                tied[owner] = tied.get(owner, 0) + info["numel"]
        flops_of = {op.label: op.flops for op in trace.ops}
        shapes_of = {op.label: op.out_shapes for op in trace.ops}
        # a model sharded across processes: how each sharded output is split (the shapes are
        # the whole's)
        placed = {op.label: op.meta["sharded"]["placement"] for op in trace.ops
                  if isinstance((op.meta or {}).get("sharded", {}).get("placement"), list)}
        calls = [c for m in trace.modules.values() for c in m.calls]
        calls.sort(key=lambda c: trace[c.ops[0]].index if c.ops else 10**9)
        expanded = {a for a, m in trace.modules.items()
                    if depth is None or m.depth < depth}
        has_children = {a.rpartition(".")[0] for a in trace.modules if "." in a}
        rows = []
        emitted: set[str] = set()
        for call in calls:
            module = trace.modules[call.address]
            if depth is not None and module.depth > depth:
                continue
            rows.extend(self._uncalled_parents(call.address, emitted))
            emitted.add(call.address)
            shown_children = call.address in expanded and call.address in has_children
            params = module.num_params if not shown_children else direct.get(call.address, 0)
            known = [flops_of[o] for o in call.ops if flops_of[o] is not None]
            flops = sum(known) if known else None
            rows.append({
                "layer": call.address + (f":{call.pass_num}" if len(module.calls) > 1 else ""),
                "type": module.type, "depth": module.depth,
                "output_shape": [s for o in call.output_ops for s in shapes_of[o]],
                "params": params if call.pass_num == 1 else 0,
                "params_pct": 100.0 * module.num_params / total if call.pass_num == 1 else 0.0,
                "recursive_params": module.num_params, "expanded": shown_children,
                "tied_params": tied.get(call.address, 0),
                "flops": flops, "macs": flops // 2 if flops is not None else None,
                "time_ms": call.time_ns / 1e6, "pass_num": call.pass_num,
            })
            placement = [p for o in call.output_ops for p in placed.get(o, ())]
            if placement:
                rows[-1]["placement"] = placement
            if with_ops:
                rows.extend(self._op_rows(call, module.depth + 1, flops_of))
        return rows

    def _add_grad_norms(self) -> None:
        """Each module call row's ``grad_norm``: the norm of the gradient at its output."""
        for row in self.rows:
            row["grad_norm"] = None
            if row.get("op") or row["time_ms"] is None:
                continue
            address = name_of(row["layer"])
            found = self.grads.modules.get(address)
            if found is None or len(found.calls) < row["pass_num"]:
                continue
            try:
                grad = found.calls[row["pass_num"] - 1].grad
            except TorchLensError:  # no tensor of its output needs a gradient
                continue
            parts = grad if isinstance(grad, tuple) else (grad,)
            row["grad_norm"] = sum(float(g.double().square().sum()) for g in parts) ** 0.5

    def _uncalled_parents(self, address: str, emitted: set[str]) -> list[dict[str, Any]]:
        """Rows for containers that never run themselves (ModuleList, ModuleDict)."""
        rows, parts = [], address.split(".")
        for k in range(1, len(parts)):
            parent = ".".join(parts[:k])
            module = self.trace.modules.get(parent)
            if module is None or module.calls or parent in emitted:
                continue
            emitted.add(parent)
            total = self.trace.num_params or 1
            rows.append({"layer": parent, "type": module.type, "depth": module.depth,
                         "output_shape": [], "params": 0, "params_pct": 100.0 *
                         module.num_params / total, "recursive_params": module.num_params,
                         "expanded": True, "tied_params": 0, "flops": None, "macs": None,
                         "time_ms": None, "pass_num": 1})
        return rows

    def _op_rows(self, call, depth, flops_of) -> list[dict[str, Any]]:
        out = []
        for label in call.ops:
            op = self.trace[label]
            if op.module != call.address or op.module_pass != call.pass_num:
                continue
            flops = flops_of[label]
            out.append({"layer": label, "type": op.func, "depth": depth,
                        "output_shape": op.out_shapes, "params": 0, "params_pct": 0.0,
                        "recursive_params": 0, "tied_params": 0, "flops": flops,
                        "macs": flops // 2 if flops is not None else None,
                        "time_ms": op.time_ns / 1e6, "pass_num": op.pass_num, "op": True})
        return out

    def _totals(self) -> dict[str, Any]:
        trace = self.trace
        params = trace.params.values()
        total = sum(p["numel"] for p in params)
        trainable = sum(p["numel"] for p in params if p["trainable"])
        flops = trace.total_flops
        input_bytes = sum(op.nbytes for op in trace.inputs)
        activation_bytes = sum(op.nbytes for op in trace.ops if op.kind == "op")
        param_bytes = sum(p["nbytes"] for p in params)
        buffer_bytes = sum(b["nbytes"] for b in trace.buffers.values())
        return {
            "total_params": total, "trainable_params": trainable,
            "frozen_params": total - trainable,
            "shared_params": sum(len(p["aliases"]) for p in params),
            "buffers": sum(b["numel"] for b in trace.buffers.values()),
            "param_bytes": param_bytes, "buffer_bytes": buffer_bytes,
            "flops": flops, "macs": flops // 2 if flops is not None else None,
            "input_bytes": input_bytes, "activation_bytes": activation_bytes,
            "estimated_total_bytes": input_bytes + activation_bytes + param_bytes + buffer_bytes,
            "ops": sum(op.kind == "op" for op in trace.ops),
            "time_ms": sum(op.time_ns for op in trace.ops) / 1e6,
        }

    # ---- text ----------------------------------------------------------------------------------
    def _cells(self, row: dict[str, Any]) -> list[str]:
        indent = "  " * (row["depth"] - 1) + ("· " if row.get("op") else "")
        if row.get("op") or row["pass_num"] > 1 or (row.get("expanded") and not row["params"]):
            params = "--"
        else:
            params = f"{row['params']:,}"
        if row.get("tied_params"):
            params = f"{row['tied_params']:,} tied" if params in ("--", "0") else \
                f"{params} +{row['tied_params']:,} tied"
        pct = "--" if row.get("op") or row["pass_num"] > 1 else f"{row['params_pct']:.1f}%"
        time_ms = "--" if row["time_ms"] is None else f"{row['time_ms']:.3f}"
        shape = format_shapes(row["output_shape"], most=2)
        if row.get("placement"):  # split across processes: the whole shape, and how
            shape += f" {', '.join(row['placement'])}"
        cells = [f"{indent}{row['layer']} ({row['type']})",
                 shape, params, pct, human(row["flops"]),
                 human(row["macs"]), time_ms]
        if self.grads is not None:
            norm = row.get("grad_norm")
            cells.append("--" if norm is None else f"{norm:.4g}")
        return cells

    def _headers(self) -> list[str]:
        return list(HEADERS) + (["Grad norm"] if self.grads is not None else [])

    def __str__(self) -> str:
        headers = self._headers()
        cells = [headers] + [self._cells(r) for r in self.rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
        rule = "=" * (sum(widths) + 2 * (len(widths) - 1))

        def line(c):
            first = c[0].ljust(widths[0])
            return "  ".join([first] + [v.rjust(w) for v, w in zip(c[1:], widths[1:])])

        t = self.totals
        lines = [f"{self.trace.meta.get('model_class', 'Model')} summary",
                 describe_provenance(self.provenance), rule, line(cells[0]), rule]
        if self.trace.edited:
            lines.insert(2, self._edited_line())
        lines += [line(c) for c in cells[1:]]
        lines += [rule,
                  f"Total params: {t['total_params']:,} (shared counted once)",
                  f"Trainable params: {t['trainable_params']:,}",
                  f"Non-trainable params: {t['frozen_params']:,}",
                  f"Buffers: {t['buffers']:,} ({_mb(t['buffer_bytes'])})",
                  f"FLOPs: {human(t['flops'])}  Mult-adds: {human(t['macs'])}",
                  f"Input size: {_mb(t['input_bytes'])}",
                  f"Forward activations: {_mb(t['activation_bytes'])}",
                  f"Params size: {_mb(t['param_bytes'])}",
                  f"Estimated total size: {_mb(t['estimated_total_bytes'])}",
                  f"Ops: {t['ops']:,}  Measured op time: {t['time_ms']:.2f} ms",
                  self._time_line(), *self._grad_line(), rule]
        lines.append(self._receipt_line())
        return "\n".join(lines)

    def _time_line(self) -> str:
        """What the Time column is, and whether one-time setup was kept out of it."""
        timing = self.trace.meta.get("timing") or {}
        what = "Time (ms): wall time of each call in the one captured forward, capture overhead " \
               "included"
        if "cuda" in self.trace.meta.get("op_time", "").lower():
            what += " (on CUDA: host launch time, not kernel time)"
        if timing.get("warmup_forwards"):
            return f"{what}; measured after one uncaptured warm-up forward (one-time setup " \
                   "excluded)"
        if timing.get("warm"):
            return f"{what}; measured after an earlier warm-up of this model on inputs of this " \
                   "shape (one-time setup excluded)"
        return f"{what}; {timing.get('note', 'no warm-up: the first calls include one-time setup')}"

    def _grad_line(self) -> list[str]:
        if self.grads is None:
            return []
        return [f"Grad norm: norm of the gradient of {self.grads.meta['grad_target']} with "
                "respect to each call's output (one more forward and backward, eval mode, "
                "model .grad untouched)"]

    def _edited_line(self) -> str:
        """An edited capture says so above the table: its values are not the model's own."""
        log = self.trace.edits
        fired = [f"{row['site']} ({row['kind']} at {row['label']}, change {row['norm']:.3g})"
                 for row in log if row["fired"]]
        return f"EDITED: {len(log.specs)} edit(s) fired {len(fired)} time(s): " + "; ".join(
            fired[:6]) + (f"; and {len(fired) - 6} more" if len(fired) > 6 else "")

    def _receipt_line(self) -> str:
        r = self.receipt
        if r is None:
            return "State: not pinned (no receipt)"
        state = "restored and verified" if r.verified else "NOT verified"
        extra = f" ({r.scope})" if r.no_values or r.offloaded else ""
        if r.materialized:
            extra += "; lazy parameters materialized: " + ", ".join(
                f"{k} {v}" for k, v in r.materialized.items())
        if r.undone:
            extra += f"; {r.undone}"
        hashed = f"state hash {r.hash_after[:12]}" if r.hashed else \
            "no resident tensor to hash"
        return f"State: eval + no-grad, {state} ({hashed}){extra}"

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        esc = html.escape
        head = "".join(f"<th>{esc(h)}</th>" for h in self._headers())
        body = "".join(
            "<tr>" + "".join(
                f"<td style='text-align:{'left' if i == 0 else 'right'}'>{esc(c)}</td>"
                for i, c in enumerate(self._cells(r))) + "</tr>" for r in self.rows)
        t = self.totals
        edited = f"<p><b>{esc(self._edited_line())}</b></p>" if self.trace.edited else ""
        return (f"<div><p><b>{esc(describe_provenance(self.provenance))}</b></p>{edited}"
                f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                f"<p>Total params: {t['total_params']:,} · trainable {t['trainable_params']:,}"
                f" · FLOPs {human(t['flops'])} · activations {_mb(t['activation_bytes'])}</p>"
                f"<p>{esc(self._time_line())}</p><p>{esc(self._receipt_line())}</p></div>")
