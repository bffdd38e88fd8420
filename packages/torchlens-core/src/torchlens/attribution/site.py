"""``tl.attribution.site(model, site)``: any site as the ``layer=`` of captum's layer methods.

captum hooks a layer with ``register_forward_hook``: it reads the layer's output, or returns a
replacement (integrated gradients' interpolations). A module site is the module itself. An op
site (the residual ``add`` of a block, which no module boundary exposes) is a stand-in module
whose forward hooks are called at that op: while a hook is registered, the model's forward runs
through TorchLens's lightest edited capture, with the op's value passed through the hooks as an
edit (every call must reach the op, or it refuses). Removing the last hook puts the model's
forward back as it was.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import TorchLensError
from ..sites import resolve

INSTALL = "pip install 'torchlens-core[attribution]'  # captum"


def _need_captum() -> None:
    try:
        import captum  # noqa: F401
    except ImportError:
        raise TorchLensError("tl.attribution needs captum, which is not installed",
                             code="dependency_missing",
                             teach=[INSTALL, "pip install captum"]) from None


class _Handle:
    """What ``register_forward_hook`` returns: ``remove()`` drops the hook, and with the last
    one the model's own forward comes back."""

    def __init__(self, site: OpSite, key: int):
        self.site, self.id = site, key

    def remove(self) -> None:
        site = self.site
        if site._hooks.pop(self.id, None) is not None and not site._hooks:
            site._uninstall()

    def __enter__(self) -> _Handle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


class OpSite(nn.Module):
    """An op of ``model`` standing as a layer: its forward hooks see (and may replace) the op's
    value each time the model runs. Not part of the model; holds no parameters."""

    def __init__(self, model: nn.Module, label: str):
        super().__init__()
        object.__setattr__(self, "_model", model)  # not a submodule: no parameters of its own
        self.label = label
        self._hooks: dict[int, Any] = {}
        self._next = 0
        self._redirect: Any = None

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Refuses: an op site runs inside its model's forward, not on its own."""
        raise TorchLensError(f"an op site ({self.label}) is run by its model, not called",
                             code="option_invalid", teach=["model(x)  # the hooks fire there"])

    def register_forward_hook(self, hook: Any, *, prepend: bool = False,
                              with_kwargs: bool = False, always_call: bool = False) -> _Handle:
        """A hook called with the op's output whenever the model runs (captum's layer hook)."""
        key = self._next
        self._next += 1
        self._hooks[key] = (hook, with_kwargs)
        if len(self._hooks) == 1:
            self._install()
        return _Handle(self, key)

    def register_forward_pre_hook(self, hook: Any, **_: Any) -> _Handle:
        """Refuses: an op site has no inputs of its own to hook."""
        raise TorchLensError(
            f"the op site {self.label} has no inputs of its own to hook: attribute to its "
            "output (attribute_to_layer_input=False), or to the op that makes its input",
            code="option_invalid",
            teach=["LayerIntegratedGradients(f, tl.attribution.site(model, label))"
                   ".attribute(x, attribute_to_layer_input=False)"])

    # ---- the model's forward while hooked ----------------------------------------------------
    def _install(self) -> None:
        from ..capture.inventory import inventory
        from ..capture.redirect import Redirect
        from ..capture.taps import edited_forward
        from ..edits.plan import EditPlan

        model = self._model
        plan = EditPlan({self.label: self._edit}, inventory(model), model,
                        surface="attribution")

        def route(args: tuple, kwargs: dict) -> Any:
            return edited_forward(model, args, kwargs, plan)

        self._redirect = Redirect(model, route)

    def _uninstall(self) -> None:
        self._redirect.remove()
        self._redirect = None

    def _edit(self, value: Any, op: Any) -> Any:
        """The op's value passed through every hook, as captum's layer hooks expect."""
        for hook, with_kwargs in list(self._hooks.values()):
            result = hook(self, (value,), {}, value) if with_kwargs else \
                hook(self, (value,), value)
            if result is not None:
                value = result
        return value


def site(model: nn.Module, site: str) -> nn.Module:
    """What captum's layer methods take as ``layer=`` for ``site``: the module itself for a
    module address, an ``OpSite`` for an op label (one pass: ``add_3`` or ``add_3:2``)."""
    _need_captum()
    if not isinstance(model, nn.Module):
        raise TorchLensError(f"tl.attribution.site takes a torch.nn.Module, not "
                             f"{type(model).__name__}", code="model_invalid",
                             teach=["tl.attribution.site(model, 'transformer.h.3')"])
    addresses = [a for a, _ in model.named_modules() if a]
    found = resolve(site, addresses, option="tl.attribution.site", model_class=type(
        model).__name__, code="edit_site_unknown",
        example=lambda c: f"tl.attribution.site(model, {c!r})")
    if len(found) != 1 or (found[0].kind == "module" and found[0].pass_num is not None):
        raise TorchLensError(
            f"{site!r} names {len(found)} module(s) or one call of a module: a layer for captum "
            "is one module or one op", code="option_invalid",
            teach=[f"tl.attribution.site(model, {found[0].name!r})"] if found else [])
    if found[0].kind == "module":
        return model.get_submodule(found[0].name)
    return OpSite(model, site)
