"""``trace.edits``: the proof of firing, one row per site and pass where an edit applied."""

from __future__ import annotations

from typing import Any

from .units import format_shape


class EditLog(list):
    """Rows (dicts): site, label, pass, module, kind, shape, index, norm of the change, and
    ``fired`` (False only for a site ``allow_unfired=True`` let pass); a step run's rows
    (``run.edits``) carry their ``step`` too, printed as the first column."""

    def __init__(self, rows: list[dict[str, Any]], specs: list[dict[str, Any]] | None = None):
        super().__init__(rows)
        self.specs = specs or []

    @property
    def unfired(self) -> list[str]:
        """The sites no edit fired at."""
        return [row["site"] for row in self if not row["fired"]]

    def __str__(self) -> str:
        if not self:
            return "no edits"
        steps = any("step" in row for row in self)
        head = ("site", "label", "pass", "module", "kind", "shape", "index", "change norm")
        lines = [("step",) * steps + head]
        for row in self:
            step = (str(row.get("step", "")),) * steps
            if not row["fired"]:
                lines.append(step + (row["site"], "-", "-", "-", row["kind"], "-",
                                     row["index"] or "", "NOT FIRED"))
                continue
            norm = f"{row['norm']:.4g}" + (" (exactly zero)" if row["zero_change"] else "")
            lines.append(step + (row["site"], row["label"] or "", str(row["pass"]),
                                 row["module"] or "<model>", row["kind"],
                                 format_shape(row["shape"]), row["index"] or "", norm))
        widths = [max(len(str(line[i])) for line in lines) for i in range(len(lines[0]))]
        return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip()
                         for line in lines)

    def __repr__(self) -> str:
        fired = sum(row["fired"] for row in self)
        steps = len({row["step"] for row in self if "step" in row})
        over = f" over {steps} step(s)" if steps else ""
        return f"<EditLog: {fired} firing(s) of {len(self.specs)} edit(s){over}>\n{self}"
