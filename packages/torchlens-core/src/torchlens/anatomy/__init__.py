"""The transformer vocabulary on any transformer, from the op graph: TransformerLens's names as
sites (``blocks.3.hook_resid_post``, ``blocks.3.attn.hook_pattern``), and ``tl.transformer(trace)``,
the residual-stream algebra over a captured trace.
"""

from __future__ import annotations

from .algebra import LogitLens, TransformerView, transformer
from .bind import Bound, anchor, expand, probe, structure_of
from .named import Named, Names, NameTaps, bind_request, expand_names, has_names, name_sites
from .structure import Structure

__all__ = ["Bound", "LogitLens", "NameTaps", "Named", "Names", "Structure", "TransformerView",
           "anchor", "bind_request", "expand", "expand_names", "has_names", "name_sites",
           "probe", "structure_of", "transformer"]
