"""Many forwards as one capture: ``with tl.steps(model, save=..., edits=..., at_steps=...) as
run:`` makes every top-level call of ``model`` in the block one step (a generation loop, a
recurrent loop, diffusion steps); ``tl.generate`` (torchlens-hf) runs ``lm.generate`` in one."""

from __future__ import annotations

from .capture import StepError, steps
from .run import StepRun

__all__ = ["StepError", "StepRun", "steps"]
