"""A plain greedy ``lm.generate`` watched by one forward hook: what the generation tests compare
TorchLens's step runs and generation records against."""

from __future__ import annotations

import torch


def hooked_generate(lm, tokenizer, prompt: str, n: int, site: str = "transformer.h.0"
                    ) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """(the output ids, ``site``'s output at each call, the prompt's length)."""
    kept = []
    handle = lm.get_submodule(site).register_forward_hook(
        lambda m, a, o: kept.append((o[0] if isinstance(o, tuple) else o).detach().clone()))
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    try:
        out = lm.generate(ids, max_new_tokens=n, do_sample=False,
                          pad_token_id=tokenizer.eos_token_id)
    finally:
        handle.remove()
    return out, kept, ids.shape[1]
