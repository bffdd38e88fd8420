"""Interventions: edit, ablate, steer and patch any op or module, with proof that each fired.

``tl.trace(model, x, edits={site: edit})`` runs the forward with each edit applied where its
site's value is produced; ``trace.edits`` lists every place an edit fired and the size of the
change. Sites are what ``save=`` takes (``torchlens.sites``).
"""

from ..edit_log import EditLog
from .plan import EditError, EditPlan
from .values import Edit, Where, add, mean, patch, replace, scale, skip, zero

__all__ = ["Edit", "EditError", "EditLog", "EditPlan", "Where", "add", "mean", "patch",
           "replace", "scale", "skip", "zero"]

from . import push  # noqa: E402,F401  (provides trace.push)
