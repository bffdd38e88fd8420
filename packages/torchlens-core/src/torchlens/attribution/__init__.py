"""Attribution with captum at any site, and attribution patching.

``tl.attribution.site(model, site)`` is the ``layer=`` captum's layer methods take, for a module
address or an op label; ``tl.attribution.patching(model, clean, corrupt, metric, sites=...)``
estimates a patching sweep from one backward: ``(clean - corrupt) · grad`` per site and
position, shaped and printed like ``tl.patching.sweep``'s result.
"""

from __future__ import annotations

from .patching import patching
from .site import OpSite, site

__all__ = ["OpSite", "patching", "site"]
