"""``with tl.steps(model, ...) as run:``: every top-level call of ``model`` inside the block is
one step (a user's loop, ``lm.generate``, a scheduler's denoising loop); calls of submodules
alone are not steps. The chosen steps (``at_steps=``) are captured with ``save=`` and
``edits=``; the others run the model's own forward behind a step counter.

While the block runs, the model's calls are redirected (``capture.redirect``): each is counted
and, on a chosen step, run through the capture (which calls the model's own forward inside);
the model's own ``forward`` comes back when the block ends, however it ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch import nn

from ..capture.boundaries import Kept
from ..capture.engine import capture, parse_save, saves_nothing
from ..capture.entry import checked_inventory
from ..capture.inventory import inventory
from ..capture.redirect import Redirect
from ..capture.seam import CaptureRequest, Part
from ..edits.plan import plan_edits
from ..errors import InputTypeError, StepError
from .follow import Follower
from .run import StepRun

MARK = "_torchlens_steps"


class StepKeeper(Part):
    """A captured step's part: the raw records, kept values and module calls of a step that
    did not follow a graph, which its run compares with the graphs it has and shares."""

    raw: tuple | None = None

    def finish(self, trace: Any, session: Any) -> None:
        """Take the step's raw records, before they are made into ops."""
        if not session.failed:
            self.raw = (session.state.records, session.state.values, session.calls)


def _selector(at_steps: Any) -> tuple[Callable[[int], bool], list[int]]:
    """(is step k chosen?, the explicit indices to check were reached)."""
    if at_steps is None:
        return (lambda k: True), []
    if isinstance(at_steps, slice):
        start, stop = at_steps.start or 0, at_steps.stop
        step = 1 if at_steps.step is None else at_steps.step
        if start < 0 or (stop is not None and stop < 0) or step < 1:
            raise InputTypeError(f"at_steps={at_steps!r}: a slice of step indices from 0",
                                 code="option_invalid", teach=["at_steps=slice(0, 3)"])
        return (lambda k: k >= start and (stop is None or k < stop) and
                (k - start) % step == 0), []
    if callable(at_steps):
        return (lambda k: bool(at_steps(k))), []
    if isinstance(at_steps, int) and not isinstance(at_steps, bool):
        at_steps = [at_steps]
    if isinstance(at_steps, Iterable):
        chosen = list(at_steps)
        if all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in chosen):
            wanted = set(chosen)
            return (lambda k: k in wanted), sorted(wanted)
    raise InputTypeError(
        f"at_steps= takes step indices, a slice or a callable step -> bool, not {at_steps!r}",
        code="option_invalid",
        teach=["at_steps=[0, 1, 2]", "at_steps=slice(1, None)", "at_steps=lambda k: k % 4 == 0"])


@contextlib.contextmanager
def steps(model: nn.Module, *, save: Any = None, edits: Any = None, at_steps: Any = None,
          allow_unfired: bool = False) -> Iterator[StepRun]:
    """Capture every top-level call of ``model`` made in the block as one step.

    ``save=`` and ``edits=`` are those of ``tl.trace`` (checked before the block runs), applied
    on the steps ``at_steps=`` chooses (indices, a slice, or a callable; default: every step).
    ``run.steps`` holds a Trace per captured step; ``len(run)`` the calls made. The model's
    modules and parameters are read once, when the block starts (again after a step whose
    forward created parameters): modules swapped inside the block are not seen. A step named in
    ``at_steps`` that the block never reached refuses ``steps_not_reached`` when the block ends;
    an exception in the block carries the steps so far as ``err.partial_run``.
    """

    if not isinstance(model, nn.Module):
        raise InputTypeError(f"tl.steps takes a torch.nn.Module, not {type(model).__name__}",
                             code="model_invalid", teach=["with tl.steps(model) as run: ..."])
    if MARK in model.__dict__:
        raise StepError("tl.steps is already capturing this model: a step run cannot hold "
                        "another", code="steps_nested",
                        teach=["end the outer `with tl.steps(model)` block first"])
    inv = checked_inventory(model, "steps")
    parse_save(save, model, inv)
    plan = plan_edits(edits, inv, model, allow_unfired, "steps")
    chosen, wanted = _selector(at_steps)
    run = StepRun(type(model).__name__, at_steps)
    kept = Kept()  # the module frames, installed at a captured step, kept for the next one

    def step(args: tuple, kwargs: dict) -> Any:
        index = run.count
        run.count += 1
        if not chosen(index):
            kept.remove()  # a step not captured runs with no frames at all
            start = time.perf_counter_ns()
            out = redirect.original(*args, **kwargs)
            run.skipped_ns += time.perf_counter_ns() - start
            return out
        nonlocal inv
        if inv is None:  # the previous step created parameters: read the model again
            inv = inventory(model)
        keeper = StepKeeper()
        parts = [p for p in (plan, keeper) if p is not None]
        graph = run.follow() if plan is None and saves_nothing(save) else None
        follower = None
        if graph is not None:  # follow the graph of the step before
            follower = Follower(*graph[1:], kept=lambda followed: run.add_followed(
                index, graph[0], followed))
            parts.append(follower)
        own = dataclasses.replace(inv, param_ids=dict(inv.param_ids))
        trace = capture(CaptureRequest(model, args, kwargs, save=save, inventory=own,
                                       keep_output=True, frames=kept), parts)
        out = trace._objects.pop("forward_output")
        if follower is not None and follower.outcome is not None:  # it kept to the graph
            return out
        if trace.annotations.get("capture_advisories"):
            inv = None
        trace.meta["step"] = index
        run.add(index, trace, keeper.raw)
        return out

    model.__dict__[MARK] = run
    redirect = Redirect(model, step)
    try:
        yield run
    except BaseException as exc:
        exc.partial_run = run
        raise
    finally:
        kept.remove()
        redirect.remove()
        del model.__dict__[MARK]
    missing = [k for k in wanted if k >= run.count]
    if missing:
        err = StepError(f"at_steps names step(s) {missing} but the block made {run.count} "
                        "call(s) of the model", code="steps_not_reached",
                        teach=[f"at_steps={[k for k in wanted if k < run.count]}"
                               if run.count else "call the model inside the block"])
        err.partial_run = run
        raise err
