"""TorchLens errors and warnings: one base class each, a stable ``.code`` and a ``.teach``.

Every refusal names what was given, what was expected and the exact next command (``.teach``).
Tests assert ``.code`` and the teach, never the whole message.
"""

from __future__ import annotations

import warnings
from typing import Any

from .units import human

# The catalogue: every code TorchLens raises or warns with, one line of meaning each.
CODES: dict[str, str] = {
    # input ladder
    "input_rung_conflict": "a real input and input_shape= were both given; the rungs are exclusive",
    "input_shape_invalid": "input_shape= is malformed (bad dims, names or slot count)",
    "input_recipe_ambiguous": "no static fact fixes the dtype/values of a synthesized input slot",
    "input_inference_failed": "no bounded shape probe produced a verified capture",
    "probe_over_budget": "diary: a rung-3 candidate would pass the probe memory/FLOP/time budget",
    "save_over_budget": "rung 3's save='all' recapture would keep more than the memory budget",
    "input_unresolved": "a real input of a kind no installed plugin resolves (e.g. a string)",
    "preprocess_unavailable": "an image was given but no preprocessing for the model is known",
    "preprocess_failed": "the image preprocessing raised or returned no usable tensor",
    "nongold_semantics_unavailable": "decoded semantics refused on a synthesized-input trace",
    "nongold_raw_value_read": "warning: first raw activation read on a synthesized-input trace",
    "semantics_unavailable": "the output has no decodable semantics (no plugin or labels)",
    # capture
    "nested_trace": "tl.trace was called from inside a forward that is being traced",
    "forward_failed": "the model's forward raised during capture; the partial trace rides on it",
    "save_selection_invalid": "save= named labels or modules that do not exist",
    "model_invalid": "the model argument is not a torch.nn.Module",
    "model_unavailable": "trace.run on a trace that holds no model (e.g. a loaded one)",
    "inference_parameters": "the model's parameters were made inside torch.inference_mode, so "
                            "writes to them cannot be followed",
    "scripted_model": "the model is a TorchScript module, whose ops run where no mode sees them",
    "scripted_submodule": "warning: a TorchScript submodule's ops are not in the trace",
    "no_differentiable_output": "validate_backward_pass on a model whose output needs no grad",
    "reentrant_checkpoint": "validate_backward_pass on a forward with reentrant activation "
                            "checkpointing, which torch.autograd.grad cannot go through",
    "option_invalid": "a keyword option has a value TorchLens cannot use",
    "dependency_missing": "an optional package a method needs (e.g. pandas) is not installed",
    # Trace access
    "key_not_found": "no op, pass or module matches the lookup key",
    "activation_not_saved": "op.out read on an op whose activation was not selected by save=",
    "activation_overwritten": "warning: a saved activation was written in place by a call "
                              "TorchLens cannot see, so only its metadata is kept",
    # files
    "trace_file_invalid": "a file given to tl.load is corrupt, truncated or not a TorchLens trace",
    # state policy
    "state_restore_failed": "a pinned surface could not restore the model's state exactly",
    "state_baseline_unavailable": "intervention_ready=True with pending lazy parameters",
    "state_changed": "the model changed since its intervention-ready trace",
    "lazy_uninitialized": "un-materialized lazy parameters/buffers where they cannot be probed",
    "batchnorm_train_stats_mutated": "warning: a train-mode capture updated BatchNorm stats",
    "parameter_created_in_forward": "advisory: a parameter was created inside the forward",
    # plugins
    "plugin_load_failed": "warning: an installed torchlens plugin failed to import and is skipped",
    "plugin_invalid": "a plugin's hook returned something malformed or clashes with another",
    "renderer_unavailable": "no renderer plugin is installed for drawing",
    # torchlens-hf
    "tokenizer_unavailable": "text for an HF model, but no tokenizer passed, attached or on disk",
    "processor_unavailable": "a modality dict for an HF model, but no processor was found",
    "tokenizer_model_mismatch": "the tokenizer produced ids the model's embedding cannot hold",
    "tokenizer_padding_unavailable": "a batch of prompts needs padding, but there is no pad token",
    "input_modality_missing": "a multimodal model (e.g. CLIP) got only some of its modalities",
    # drawings
    "draw_option_invalid": "a drawing keyword is unknown or has a value it cannot take",
    "graphviz_not_found": "Graphviz's dot program is not installed, so no PDF/SVG/PNG layout",
    "render_failed": "a renderer could not turn the drawing source into the requested format",
    # recording store (tl.record(..., to=), tl.recording.open)
    "recording_mismatch": "to= holds a store written by another model, selection or options",
    "recording_invalid": "a recording store is missing, corrupt or not a TorchLens store",
    "recording_write_failed": "a shard or manifest could not be written (disk full, I/O error)",
    "recording_input_changed": "an input's structure (labels, shapes, dtypes) changed mid-stream",
    "recording_value_unsupported": "a selected value cannot be stored as rows (not one tensor "
                                   "with the batch first)",
    "inputs_empty": "tl.record was given an empty iterable of inputs",
    # models without values (meta device)
    "meta_values_unavailable": "values were asked of a model on the meta device (shapes only)",
    "meta_op_unsupported": "a data-dependent op (nonzero, a boolean mask) has no meta kernel",
    "distributed_unavailable": "torchrun variables are set but the process group cannot start",
    "sharded_ranks_disagree": "the ranks of a model sharded across processes were asked "
                              "different captures (save=, edits=, input shapes)",
    "sharded_rank_failed": "a collective of a sharded capture failed: another rank raised, "
                           "timed out or is not running the same capture",
    "record_sharded_unsupported": "tl.record on a model sharded across processes with an "
                                  "option it cannot record whole yet (compile=, generate=, "
                                  "names, FSDP2 with tensor parallel)",
    "push_sharded_unsupported": "trace.push on a trace of a model sharded across processes "
                                "(whole values, sharded parameters); re-run with the edits",
    # edits and patching (tl.edits, edits=, tl.patching)
    "edit_invalid": "an edit, its site key, index= or item= is malformed, or a callable edit "
                    "returned no tensor",
    "edit_index_out_of_range": "an edit's index= or head= addresses an entry the value at its "
                               "site does not have (an axis shorter than the index)",
    "edit_site_unknown": "an edits= site names no op label, module address or glob of the model",
    "edit_name_read_only": "edits= names a transformer name derived for reading only (each "
                           "head's share of the output), which has no tensor to edit",
    "edit_head_not_attention": "head= at a site whose value has no head axis (not an attention "
                               "name)",
    "edit_site_not_fired": "an edit's site never fired in the forward (the partial trace rides "
                           "on the error)",
    "edit_shape_mismatch": "an edit's value does not fit the site's shape (skip: input and "
                           "output differ)",
    "edit_dtype_mismatch": "an edit's value cannot be cast to the site's dtype",
    "edit_source_missing": "a patch or mean source trace holds no value at the site",
    "edit_source_model_mismatch": "a patch or mean source trace is of another model",
    "push_needs_values": "trace.push on a trace without every value or its recorded calls "
                         "(save='all', intervention_ready=True)",
    "push_unsafe": "trace.push would recompute an op whose value decided control flow or "
                   "whose shape depends on values; re-run instead",
    "patching_inputs_mismatch": "a patching sweep's clean and corrupt inputs differ in shape",
    "patching_batch_unsafe": "a batched patching cell differs from the same cell alone",
    "metric_invalid": "a sweep's metric= gave no single finite number on the clean run's "
                      "output (a vector, a non-number), or raised",
    "metric_baselines_equal": "a sweep's metric= is the same on the clean and the corrupt run, "
                              "so no cell can be normalised between them",
    "compare_input_invalid": "tl.compare was given neither two traces, two models and an "
                             "input, nor one model and two inputs",
    "grads_unavailable": "save_grads= or a gradient read where no autograd graph exists "
                         "(grad mode off, a meta model, no save_grads=, no backward yet)",
    "grads_target_invalid": "trace.backward's target is not one number that needs a gradient",
    "grads_graph_freed": "a second trace.backward after the first freed the graph (no "
                         "retain_graph=True)",
    "steps_nested": "tl.steps on a model a step run is already capturing",
    "steps_not_reached": "at_steps= named a step the block never reached (or run[i] past its "
                         "end)",
    "step_not_captured": "run[i] for a step at_steps= did not choose",
    "site_not_in_architecture": "a transformer name or read the model's architecture does not "
                                "have (no list of blocks, no final norm, a block never ran)",
    "transformer_hint_disagrees": "a plugin's transformer hint contradicts the traced graph",
    "transformer_needs_model": "tl.transformer on a trace that holds no live model (a loaded "
                               "one)",
    "site_not_compilable": "compile=: a site whose value the compiled graph cannot give as the "
                           "eager capture does (a drifted op count, a part that needs every op)",
    "compile_recompile_limit": "compile=: the forward recompiled past the limit (its input "
                               "shapes or Python values keep changing)",
    "compile_failed": "compile=: torch.compile raised while compiling the forward with its taps",
    "drawing_too_large": "a static drawing too large for dot to lay out in seconds (refused "
                         "before layout)",
}


class TorchLensError(Exception):
    """Base of every TorchLens refusal; ``.code`` is stable, ``.teach`` lists next commands."""

    code: str = "torchlens_error"

    def __init__(self, message: str, *, code: str | None = None, teach: str | list[str] = ()):
        if code is not None:
            self.code = code
        self.teach: list[str] = [teach] if isinstance(teach, str) else list(teach)
        self.message = message
        text = f"[{self.code}] {message}"
        if self.teach:
            text += "\nNext:\n" + "\n".join(f"  {i}. {t}" for i, t in enumerate(self.teach, 1))
        super().__init__(text)


class InputError(TorchLensError, ValueError):
    """The input given to a verb cannot be used as it stands."""


class InputTypeError(TorchLensError, TypeError):
    """The input or an argument has a type TorchLens cannot take."""


class CaptureError(TorchLensError, RuntimeError):
    """The capture itself could not run or finish."""


class LookupFailed(TorchLensError, KeyError):
    """A key into a Trace matched nothing."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return Exception.__str__(self)


class TraceFileError(TorchLensError, ValueError):
    """A saved-trace file is unreadable: corrupt, truncated or foreign."""

    code = "trace_file_invalid"


class StateError(TorchLensError, RuntimeError):
    """The model's state is not what a surface's policy promises."""


class EditError(TorchLensError, ValueError):
    """An edit that cannot apply where it fired, or that never fired."""


class RecordingError(TorchLensError, RuntimeError):
    """A recording store cannot be written or read as asked."""


class RendererError(TorchLensError, RuntimeError):
    """No renderer fits, or a renderer failed to produce its output."""


class DrawingTooLarge(TorchLensError, RuntimeError):
    """A static drawing is larger than a layout program lays out in a few seconds."""

    code = "drawing_too_large"


class DrawOptionError(TorchLensError, TypeError, ValueError):
    """A keyword given to a drawing surface is unknown or has a value it cannot take."""

    code = "draw_option_invalid"


class StepError(TorchLensError, RuntimeError):
    """A step run that cannot start, or that ended without a step it was asked for."""


class GradError(TorchLensError, RuntimeError):
    """A gradient that cannot be computed or read as asked."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message (empty for an exception without one), cut to
    ``limit`` characters: what a refusal quotes of the error it turns into a TorchLensError."""
    lines = str(exc).splitlines()
    return lines[0][:limit] if lines else ""


def surface_call(surface: str, options: str = "") -> str:
    """The call of ``surface`` a user makes, with ``options`` (keywords as written): what a
    teach names, so a teach is the user's own call, corrected (``with tl.steps(model, ...) as
    run: ...``, ``tl.generate(lm, prompt, ...)``, ``trace.push(...)``)."""
    more = f", {options}" if options else ""
    if surface == "steps":
        return f"with tl.steps(model{more}) as run: ..."
    if surface == "generate":
        return f"tl.generate(lm, prompt{more})"
    if surface == "push":
        return f"trace.push({options.removeprefix('edits=')})"
    if surface == "record":  # save= is not optional there
        return f"tl.record(model, inputs{'' if 'save=' in options else ', save=[...]'}{more})"
    if surface in ("patching.sweep", "attribution.patching"):
        return f"tl.{surface}(model, clean, corrupt{more})"
    return f"tl.{surface}(model, x{more})"


GRADS_TEACH = 'trace = tl.trace(model, x, save_grads="all")  # then trace.backward(target)'


def grads_unavailable(why: str, teach: list[str] | None = None) -> GradError:
    """The refusal of a gradient read where none can be had (``grads_unavailable``)."""
    return GradError(f"gradients are not available: {why}", code="grads_unavailable",
                     teach=teach or [GRADS_TEACH])


class TargetError(Exception):
    """The model target could not be imported or built."""


class SiteUnknown(Exception):
    """A site string names nothing in this model; ``close`` holds the nearest names."""

    def __init__(self, text: str, close: list[str]):
        super().__init__(text)
        self.text, self.close = text, close


class OverBudget(RuntimeError):
    """A probe would need more memory or FLOPs than its budget (raised before allocating)."""

    def __init__(self, what: str, needed: float, limit: float, at: str):
        self.what, self.needed, self.limit, self.at = what, needed, limit, at
        unit = "bytes" if what == "memory" else "FLOPs"
        super().__init__(f"needs more than its {what} budget: at least "
                         f"{human(needed, digits=1)} {unit} (at {at}) > "
                         f"{human(limit, digits=1)} {unit}")


def add_note(exc: BaseException, note: str) -> None:
    """PEP 678's ``exc.add_note``, which Python 3.11 added; on 3.10 the note goes on
    ``exc.__notes__`` all the same, though 3.10's traceback does not print it."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]


class TorchLensWarning(UserWarning):
    """Base of TorchLens warnings; the message starts with the code so it can be filtered."""

    def __init__(self, code: str, message: str):
        self.code = code
        super().__init__(f"{code}: {message}")


def warn(code: str, message: str, stacklevel: int | None = 2) -> None:
    """Emit a TorchLensWarning whose message starts with ``code``; stacklevel counts from the
    caller of ``warn`` (2 = that caller's caller); None: the first caller outside TorchLens."""
    if stacklevel is None:
        import sys

        frame, stacklevel = sys._getframe(1), 1
        while frame.f_back is not None and \
                frame.f_globals.get("__name__", "").partition(".")[0] == "torchlens":
            frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(TorchLensWarning(code, message), stacklevel=stacklevel + 1)


def pandas_for(what: str, instead: str) -> Any:
    """The pandas module, or ``dependency_missing`` saying ``what`` needs it and ``instead``
    (the same rows without pandas)."""
    try:
        import pandas
    except ImportError as exc:
        raise TorchLensError(f"{what} needs pandas, which is not installed",
                             code="dependency_missing",
                             teach=["pip install pandas", instead]) from exc
    return pandas
