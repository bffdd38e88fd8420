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

from ..capabilities import lookup
from ..capture.boundaries import Kept
from ..capture.engine import capture, parse_save, saves_nothing
from ..capture.entry import checked_inventory
from ..capture.inventory import inventory
from ..capture.redirect import Redirect
from ..capture.seam import CaptureRequest, Part
from ..edits.plan import plan_edits
from ..errors import InputTypeError, StepError, surface_call
from .follow import Follower
from .run import StepRun

MARK = "_torchlens_steps"
_NAMED = object()  # edits= naming transformer names: planned at each step, once bound


class StepKeeper(Part):
    """A captured step's part: the raw records, kept values and module calls of a step that
    did not follow a graph, which its run compares with the graphs it has and shares."""

    raw: tuple | None = None

    def finish(self, trace: Any, session: Any) -> None:
        """Take the step's raw records, before they are made into ops."""
        if not session.failed:
            self.raw = (session.state.records, session.state.values, session.calls)


@dataclasses.dataclass
class StepsCall:
    """The call that made a step run, for its teaches: ``surface`` "steps" (``with
    tl.steps(model, ...) as run``) or "generate" (``tl.generate(lm, prompt, ...)``), with the
    user's own keywords as they would be written (``options``: keyword -> code)."""

    surface: str = "steps"
    options: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, surface: str, **options: Any) -> StepsCall:
        """The call of ``surface`` with the keywords given (None: not given): short values as
        their repr, long ones by their keyword's name (``edits=edits``)."""
        shown = {}
        for key, value in options.items():
            if value is None or value is False:
                continue
            text = value if isinstance(value, Code) else repr(value)
            shown[key] = text if len(text) <= 40 and "<" not in text else key
        return cls(surface, shown)

    def text(self, comment: str = "", **changes: Any) -> str:
        """The call with ``changes`` (keyword -> value; None drops it), then ``comment``."""
        options = dict(self.options)
        for key, value in changes.items():
            if value is None:
                options.pop(key, None)
            else:
                options[key] = value if isinstance(value, Code) else repr(value)
        text = surface_call(self.surface, ", ".join(f"{k}={v}" for k, v in options.items()))
        return f"{text}  # {comment}" if comment else text


class Code(str):
    """A keyword's value already written as code (not to be repr'd)."""


class TaughtRun(StepRun):
    """A ``StepRun`` whose refusals teach the call that made it (``StepsCall``): a step not
    captured, the call with ``at_steps=`` naming it too; a step past the run's end, the last
    step there is (and, for ``tl.generate``, the call generating far enough)."""

    def __init__(self, model_class: str, selected: Any, call: StepsCall):
        super().__init__(model_class, selected)
        self.call = call

    def __getitem__(self, index: int) -> Any:
        try:
            return super().__getitem__(index)
        except StepError as err:
            if err.code not in ("step_not_captured", "steps_not_reached"):
                raise
            raise StepError(err.message, code=err.code, teach=self._teach(index)) from None

    def draw(self, *, step: int | None = None, path: Any = None, **dials: Any):
        """``StepRun.draw``; a run that captured no step refuses with its own call."""
        if not self.captured:
            raise StepError("this run captured no step to draw", code="step_not_captured",
                            teach=[self.call.text("every step", at_steps=None)])
        return super().draw(step=step, path=path, **dials)

    def _teach(self, index: int) -> list[str]:
        step = index + self.count if index < 0 else index
        last = f"run[{self.captured[-1]}]  # the last step captured" if self.captured else None
        if step >= self.count:  # past the run's end
            teach = [self.call.text(max_new_tokens=step + 1, at_steps=sorted(
                {*_chosen(self._selected, self.captured), step}))] \
                if self.call.surface == "generate" else []
            return [*teach, *([last] if last else [self.call.text(
                "call the model inside the block")])]
        chosen = sorted({*_chosen(self._selected, self.captured), step})
        return [self.call.text(at_steps=chosen if len(chosen) <= 16 else None)]


def _chosen(selected: Any, captured: list[int]) -> list[int]:
    """The steps a run's ``at_steps=`` named, as a list (its captured steps where it was a
    slice or a callable)."""
    if isinstance(selected, int) and not isinstance(selected, bool):
        return [selected]
    if isinstance(selected, (list, tuple, set, frozenset, range)):
        return [k for k in selected if isinstance(k, int)]
    return list(captured)


def selector(at_steps: Any, call: StepsCall | None = None, key: str = "at_steps"
             ) -> tuple[Callable[[int], bool], list[int]]:
    """(is step k chosen?, the explicit indices to check were reached), for the keyword
    ``key`` (``at_steps`` or ``edit_steps``)."""
    call = call or StepsCall()
    if at_steps is None:
        return (lambda k: True), []
    if isinstance(at_steps, slice):
        start, stop = at_steps.start or 0, at_steps.stop
        step = 1 if at_steps.step is None else at_steps.step
        if start < 0 or (stop is not None and stop < 0) or step < 1:
            raise InputTypeError(f"{key}={at_steps!r}: a slice of step indices from 0",
                                 code="option_invalid",
                                 teach=[call.text(**{key: slice(0, 3)})])
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
        f"{key}= takes step indices, a slice or a callable step -> bool, not {at_steps!r}",
        code="option_invalid",
        teach=[call.text(**{key: [0, 1, 2]}), call.text(**{key: slice(1, None)}),
               call.text(**{key: Code("lambda k: k % 4 == 0")})])


@contextlib.contextmanager
def steps(model: nn.Module, *, save: Any = None, edits: Any = None, at_steps: Any = None,
          edit_steps: Any = None, allow_unfired: bool = False) -> Iterator[StepRun]:
    """Capture every top-level call of ``model`` made in the block as one step.

    ``save=`` and ``edits=`` are those of ``tl.trace`` (checked before the block runs), applied
    on the steps ``at_steps=`` chooses (indices, a slice, or a callable; default: every step).
    ``edit_steps=`` (the same forms) applies the edits on those steps only, captured too,
    while ``at_steps`` chooses the steps saved: read every step, edit steps 3 and 4.
    ``run.steps`` holds a Trace per captured step; ``len(run)`` the calls made. The model's
    modules and parameters are read once, when the block starts (again after a step whose
    forward created parameters): modules swapped inside the block are not seen. A step named in
    ``at_steps`` that the block never reached refuses ``steps_not_reached`` when the block ends;
    an exception in the block carries the steps so far as ``err.partial_run``.
    """

    call = StepsCall.of("steps", save=save, edits=Code("edits") if edits is not None else None,
                        at_steps=at_steps, edit_steps=edit_steps, allow_unfired=allow_unfired)
    with capture_steps(model, call, save=save, edits=edits, at_steps=at_steps,
                       edit_steps=edit_steps, allow_unfired=allow_unfired) as run:
        yield run


@contextlib.contextmanager
def capture_steps(model: nn.Module, call: StepsCall, *, save: Any, edits: Any, at_steps: Any,
                  allow_unfired: bool, edit_steps: Any = None) -> Iterator[StepRun]:
    """``tl.steps``'s block for the call ``call`` (``tl.steps`` or ``tl.generate``), whose
    refusals teach that call, corrected."""
    surface = call.surface
    if not isinstance(model, nn.Module):
        raise InputTypeError(f"tl.{surface} takes a torch.nn.Module, not {type(model).__name__}",
                             code="model_invalid", teach=[call.text()])
    if MARK in model.__dict__:
        raise StepError("tl.steps is already capturing this model: a step run cannot hold "
                        "another", code="steps_nested",
                        teach=[call.text("one block at a time: end the outer one first")])
    inv = checked_inventory(model, surface)
    # transformer names are bound at each captured step, to its own input (capabilities)
    names = lookup("has_transformer_names")(save, edits, inv)
    if not names:
        parse_save(save, model, inv, surface)
    plan = plan_edits(edits, inv, model, allow_unfired, surface) if not names else \
        _NAMED if edits is not None else None
    chosen, wanted = selector(at_steps, call)
    edited, edit_wanted = (chosen, []) if edit_steps is None else \
        selector(edit_steps, call, "edit_steps")
    if edit_steps is not None and edits is None:
        raise InputTypeError("edit_steps= chooses the steps edits= apply on, but no edits= "
                             "was given", code="option_invalid",
                             teach=[call.text(edits=Code("{'<site>': tl.edits.zero()}"))])
    wanted = sorted({*wanted, *edit_wanted})
    run = TaughtRun(type(model).__name__, at_steps, call)
    kept = Kept()  # the module frames, installed at a captured step, kept for the next one

    def step(args: tuple, kwargs: dict) -> Any:
        index = run.count
        run.count += 1
        editing = plan is not None and edited(index)
        if not (chosen(index) or editing):
            kept.remove()  # a step not captured runs with no frames at all
            start = time.perf_counter_ns()
            out = redirect.original(*args, **kwargs)
            run.skipped_ns += time.perf_counter_ns() - start
            return out
        nonlocal inv
        if inv is None:  # the previous step created parameters: read the model again
            inv = inventory(model)
        keeper, step_save, named, step_plan = StepKeeper(), save, None, plan
        if names:  # bound to this step's input; its Trace is kept whole (it holds the names)
            step_save, sites, named = lookup("bind_transformer_names")(
                model, args, kwargs, inv, save, edits)
            parse_save(step_save, model, inv, surface)
            step_plan = plan_edits(edits, inv, model, allow_unfired, surface, named=sites) \
                if editing else None
            keeper = None
        parts = [p for p in (step_plan if editing else None, named, keeper) if p is not None]
        graph = run.follow() if not editing and saves_nothing(step_save) and not names \
            else None
        follower = None
        if graph is not None:  # follow the graph of the step before
            follower = Follower(*graph[1:], kept=lambda followed: run.add_followed(
                index, graph[0], followed))
            parts.append(follower)
        own = dataclasses.replace(inv, param_ids=dict(inv.param_ids))
        trace = capture(CaptureRequest(model, args, kwargs, save=step_save, inventory=own,
                                       keep_output=True, frames=kept), parts)
        out = trace._objects.pop("forward_output")
        if follower is not None and follower.outcome is not None:  # it kept to the graph
            return out
        if trace.annotations.get("capture_advisories"):
            inv = None
        trace.meta["step"] = index
        run.add(index, trace, keeper.raw if keeper is not None else None)
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
        err = StepError(f"at_steps/edit_steps name step(s) {missing} but the "
                        f"{'generation' if surface == 'generate' else 'block'} made "
                        f"{run.count} call(s) of the model", code="steps_not_reached",
                        teach=_not_reached(call, wanted, run.count))
        err.partial_run = run
        raise err


def _not_reached(call: StepsCall, wanted: list[int], count: int) -> list[str]:
    """The teaches of at_steps= naming steps past the ``count`` calls made: the call with the
    steps it reached (or its last step, where it reached none of them); for ``tl.generate``,
    first the call that generates every step named (its end-of-text token stopped it early)."""
    reached = [k for k in wanted if k < count] or ([count - 1] if count else [])
    teach = []
    if call.surface == "generate":
        need = max(wanted) + 1
        teach.append(call.text(max_new_tokens=need, min_new_tokens=need))
    if reached:
        teach.append(call.text(at_steps=reached))
    elif call.surface == "steps":
        teach.append(call.text().replace(": ...", ": model(x)  # call the model in the block"))
    return teach
