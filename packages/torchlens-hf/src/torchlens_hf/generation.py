"""``tl.generate(lm, prompt, max_new_tokens=16, save=..., edits=..., at_steps=...,
edit_steps=...)``: a Hugging
Face model's own ``generate`` run inside ``tl.steps``, the prompt resolved through the input
ladder as a gold input (the model's own tokenizer, recorded in the provenance). Greedy unless
told otherwise; step 0 is the prefill, step ``i`` the forward that chose new token ``i``."""

from __future__ import annotations

from typing import Any

from torch import nn

from torchlens.steps import StepRun
from torchlens.steps.capture import Code, StepsCall, capture_steps, selector


def generate(lm: nn.Module, prompt: Any, /, *, max_new_tokens: int = 16, save: Any = None,
             edits: Any = None, at_steps: Any = None, edit_steps: Any = None,
             allow_unfired: bool = False, tokenizer: Any = None, **generate_kwargs: Any
             ) -> StepRun:
    """Generate from ``prompt`` (a string, or what the ladder resolves) and capture every
    forward ``generate`` makes as a step (``at_steps=`` the steps saved, ``edit_steps=`` the
    steps edited, as ``tl.steps``'s). The run has ``.text``, ``.tokens`` (the new ids),
    ``.output_ids`` (prompt and new), and per captured step the token it chose."""
    from torchlens.capture.entry import checked_inventory, input_options, resolve_for
    from torchlens.errors import InputTypeError, StepError

    call = StepsCall.of("generate", max_new_tokens=max_new_tokens, save=save,
                        edits=Code("edits") if edits is not None else None, at_steps=at_steps,
                        edit_steps=edit_steps, allow_unfired=allow_unfired, **generate_kwargs)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or \
            max_new_tokens < 1:
        raise InputTypeError(f"max_new_tokens= takes a positive int, not {max_new_tokens!r}",
                             code="option_invalid", teach=[call.text(max_new_tokens=16)])
    for key, chosen in (("at_steps", at_steps), ("edit_steps", edit_steps)):
        wanted = selector(chosen, call, key)[1]
        if wanted and wanted[-1] >= max_new_tokens:  # known now: one forward a new token
            raise StepError(f"{key} names step(s) {[k for k in wanted if k >= max_new_tokens]},"
                            f" but max_new_tokens={max_new_tokens} makes steps 0 to "
                            f"{max_new_tokens - 1} (step 0 the prefill)",
                            code="steps_not_reached",
                            teach=[call.text(max_new_tokens=wanted[-1] + 1),
                                   call.text(**{key: [k for k in wanted if k < max_new_tokens]
                                                or None})])
    if not hasattr(lm, "generate"):
        raise InputTypeError(f"{type(lm).__name__} has no generate(): tl.generate runs a "
                             "Hugging Face generation model's", code="model_invalid",
                             teach=["with tl.steps(model) as run: ...  # your own loop"])
    inv = checked_inventory(lm, "generate")
    res = resolve_for(lm, prompt, input_kwargs=None, input_shape=None, surface="generate",
                      options=input_options(tokenizer, None, None), inv=inv)
    tok = res.objects.get("tokenizer") or tokenizer
    kwargs = dict(res.kwargs)
    ids = kwargs.get("input_ids", res.args[0] if res.args else None)
    options = {"do_sample": False, **generate_kwargs}
    if tok is not None and getattr(lm.generation_config, "pad_token_id", None) is None:
        options.setdefault("pad_token_id", tok.pad_token_id if tok.pad_token_id is not None
                           else tok.eos_token_id)
    with capture_steps(lm, call, save=save, edits=edits, at_steps=at_steps,
                       edit_steps=edit_steps, allow_unfired=allow_unfired) as run:
        out = lm.generate(*res.args, **kwargs, max_new_tokens=max_new_tokens, **options)
    new = out[:, ids.shape[-1]:] if ids is not None else out
    run.output_ids = out
    run.tokens = new[0].tolist()
    run.text = tok.decode(new[0], skip_special_tokens=True) if tok is not None else None
    run.provenance = res.provenance
    for i, token in enumerate(run.tokens):
        if i in run._steps:
            run._steps[i].token = token
    return run
