"""Models sharded across processes (DTensor tensor parallel, FSDP2's ``fully_shard``) under
torchrun: a capture reads each value whole, as the unsharded model would hold it.

``join(model, parts)`` is how a surface takes part: for a model with DTensor parameters it
returns the surface's parts with the sharded gather around them (``part.Sharded``), and the
parts as they are for any other model (one ``sys.modules`` look-up: no DTensor exists before
torch.distributed.tensor is imported). ``sharding(model)`` says how the model is split: by
tensor (every rank takes the same input) or by data (FSDP2: each rank its own).
"""

from __future__ import annotations

from .part import Sharded, join, sharded_model, sharding

__all__ = ["Sharded", "join", "sharded_model", "sharding"]
