"""``run.draw(path="gen.html")``: the viewer with a step selector. The page holds each distinct
graph once (the prefill apart when its graph differs) and, per step, what is its own: op
times, the shapes that differ, the token it chose. Choosing a step of the same graph repaints
it; one of another graph reopens the page on that graph. A static format draws one step."""

from __future__ import annotations

import os
from typing import Any

from ..capabilities import provide
from ..errors import StepError
from ..units import format_shape
from .draw import draw_with_pages, validate_options
from .page import PageModel, build_page


@provide("draw_steps")
def draw_run(run: Any, *, step: int | None = None, path: str | os.PathLike | None = None,
             **dials: Any):
    """Draw ``run``: the interactive page with every captured step, or step ``step``
    (default: the first captured) in a static format."""
    captured = run.captured
    if not captured:
        raise StepError("this run captured no step to draw", code="step_not_captured",
                        teach=["tl.steps(model, at_steps=None)  # every step"])
    first = captured[0] if step is None else step
    shown = run[first]  # refuses a step not captured
    dials.setdefault("collapse", "auto")
    opts = validate_options(path=path, **dials)

    def pages(opts: Any) -> Any:
        return _step_page(run, first, opts)

    return draw_with_pages(shown, opts, pages=pages)


def _step_page(run: Any, current: int, opts: Any) -> Any:
    graphs: dict[int, int] = {}  # the step holding a graph -> its position in the page
    datas = []
    for i in run.captured:
        holder = run.shared(i)
        if holder not in graphs:
            graphs[holder] = len(datas)
            datas.append(build_page(run[holder], opts).data)
    rows = []
    for i in run.captured:
        g = graphs[run.shared(i)]
        labels = datas[g]["ops"]["label"]
        template = datas[g]["ops"]["shape"]
        trace = run[i]
        by_label = {op.label: op for op in trace.ops}
        ops = [by_label[label] for label in labels]
        shapes = {k: format_shape(op.shape, unknown="") for k, op in enumerate(ops)
                  if format_shape(op.shape, unknown="") != template[k]}
        step = run._steps[i]
        rows.append({"step": i, "graph": g, "token": step.token,
                     "time_ms": round(step.time_ns / 1e6, 3),
                     "time_ns": [op.time_ns for op in ops], "shapes": shapes})
    position = run.captured.index(current)
    shown = datas[rows[position]["graph"]]
    return PageModel(shown["title"], opts.theme, opts.direction, {**shown, "steps": {
        "rows": rows, "current": position, "graphs": datas, "text": run.text}})
