"""How a transformer name reads and writes the tensor it stands on.

A name stands on an op's output (its *anchor*). The lens reads the name's value from it in
TransformerLens's layout (a view where it can be one: the reshape that splits heads, the
transpose to ``[batch, pos, head, d_head]``) and writes an edited value back into the anchor's
layout, so an edit of the name is an edit of the real tensor the model goes on with. The
attention lenses of a fused ``scaled_dot_product_attention`` call recompute the scores and the
pattern exactly from that call's q, k, mask, causal flag, scale and GQA repeat, and an edited
pattern recomputes the call as ``pattern @ v``. A ``flex_attention`` call's are recomputed the way
its eager implementation computes them (its ``score_mod`` and its block mask's ``mask_mod``
evaluated over the whole grid), and checked against the call's own output before they are given.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import Any

import torch
from torch import Tensor

from ..errors import EditError, InputError, TorchLensError


class Lens:
    """The identity: the name's value is the anchor's output as it is."""

    name: str | None = None  # the name it reads (set when bound)
    head_axis: int | None = None  # the head axis of the name's layout (what ``head=`` indexes)
    derived = False  # computed from the anchor call's arguments, during the capture
    editable = True
    identity = True  # the name's value is the anchor's output itself

    def __init__(self, head_axis: int | None = None):
        self.head_axis = head_axis

    def read(self, value: Tensor, args: tuple = (), kwargs: dict | None = None) -> Tensor:
        """The name's value from the anchor's output (a view of it where the lens is one)."""
        return value

    def write(self, value: Tensor, new: Tensor, args: tuple = (),
              kwargs: dict | None = None) -> Tensor:
        """The anchor's output with the name's value replaced by ``new``."""
        out = value.clone()
        self.read(out).copy_(new)
        return out


class Transposed(Lens):
    """``[batch, head, pos, d_head]`` (what attention kernels take) read as ``[batch, pos, head,
    d_head]``."""

    identity = False

    def __init__(self) -> None:
        super().__init__(head_axis=2)

    def read(self, value, args=(), kwargs=None):
        return value.transpose(1, 2)


class SplitHeads(Lens):
    """A projection's ``[batch, pos, heads * d_head]`` read as ``[batch, pos, head, d_head]``."""

    identity = False

    def __init__(self, heads: int):
        super().__init__(head_axis=2)
        self.heads = heads

    def read(self, value, args=(), kwargs=None):
        return value.unflatten(-1, (self.heads, -1))


class Reshaped(Lens):
    """A value the model keeps flattened (OPT's MLP runs on ``[batch * pos, width]``) read in
    the stream's layout, ``[batch, pos, width]`` (through ``inner``, an elementwise lens such
    as a norm's ``Affine``, first)."""

    identity = False

    def __init__(self, shape: list[int], inner: Lens | None = None):
        super().__init__()
        self.shape, self.inner = list(shape), inner or Lens()

    def read(self, value, args=(), kwargs=None):
        return self.inner.read(value).reshape(self.shape)

    def write(self, value, new, args=(), kwargs=None):
        return self.inner.write(value, new.reshape(value.shape)).clone()


class Affine(Lens):
    """A norm's output read as its normalized value before the norm's own scale and shift
    (TransformerLens's ``hook_normalized``): ``(out - bias) / weight``; an edited value goes back
    as ``new * weight + bias``."""

    identity = False

    def __init__(self, weight: Tensor | None, bias: Tensor | None):
        super().__init__()
        self.weight = None if weight is None else weight.detach()
        self.bias = None if bias is None else bias.detach()

    def read(self, value, args=(), kwargs=None):
        if self.bias is not None:
            value = value - self.bias.to(value.dtype)
        return value if self.weight is None else value / self.weight.to(value.dtype)

    def write(self, value, new, args=(), kwargs=None):
        if self.weight is not None:
            new = new * self.weight.to(new.dtype)
        return new if self.bias is None else new + self.bias.to(new.dtype)


def norm_lens(norm: Any) -> Lens:
    """The ``Affine`` lens of a norm module (Gemma's RMSNorm scales by ``1 + weight``)."""
    weight, bias = getattr(norm, "weight", None), getattr(norm, "bias", None)
    if weight is not None and "gemma" in type(norm).__name__.lower():
        weight = 1 + weight.detach()
    return Affine(weight if isinstance(weight, Tensor) else None,
                  bias if isinstance(bias, Tensor) else None)


class Batched(Lens):
    """A value made once for every row (a learned position embedding, ``[1, pos, d_model]``)
    read as ``[batch, pos, d_model]``; an edit must leave the rows equal."""

    identity = False

    def __init__(self, batch: int):
        super().__init__()
        self.batch = batch

    def read(self, value, args=(), kwargs=None):
        if value.shape[0] == 1 and self.batch > 1:
            return value.expand(self.batch, *value.shape[1:])
        return value

    def write(self, value, new, args=(), kwargs=None):
        if value.shape[0] == new.shape[0]:
            return new.clone()
        if not (new == new[:1]).all():
            raise EditError(
                f"{self.name!r} is computed once for every row of the batch, so an edit "
                "there must change every row alike", code="edit_shape_mismatch",
                teach=[f"edits={{{self.name!r}: tl.edits.add(vector)}}  # the same for every row"])
        return new[:1].clone()


class Result(Lens):
    """Each head's contribution to the attention's output, ``[batch, pos, head, d_model]``: z
    (``[batch, pos, head, d_head]``) through that head's slice of the output projection (its
    sum over heads plus the bias is ``hook_attn_out``). Read only."""

    identity = False

    editable = False

    def __init__(self, inner: Lens, weight: Tensor, transposed: bool):
        super().__init__(head_axis=2)
        self.inner, self.weight, self.transposed = inner, weight, transposed

    def read(self, value, args=(), kwargs=None):
        z = self.inner.read(value)
        heads, d_head = z.shape[-2], z.shape[-1]
        # nn.Linear keeps (d_model, heads * d_head); GPT-2's Conv1D the transpose
        w = self.weight.detach() if self.transposed else self.weight.detach().t()
        w_o = w.reshape(heads, d_head, -1).to(z.dtype)
        return torch.einsum("bphd,hdm->bphm", z, w_o)


def sdpa_args(args: tuple, kwargs: dict) -> dict[str, Any]:
    """A ``scaled_dot_product_attention`` call's arguments by name."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
             "enable_gqa")
    bound = dict(zip(names, args))
    bound.update(kwargs or {})
    return bound


def sdpa_scores(call: dict[str, Any]) -> Tensor:
    """The masked attention scores ``q k^T * scale (+ mask)`` of a call, ``[batch, head, q, k]``,
    in float32 at least (as eager implementations compute the softmax); masked positions -inf."""
    q, k = call["query"], call["key"]
    dtype = torch.promote_types(q.dtype, torch.float32)
    if k.shape[-3] != q.shape[-3]:  # grouped-query attention: each kv head serves a group
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    scale = call.get("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)).to(dtype) * scale
    n_q, n_k = scores.shape[-2], scores.shape[-1]
    if call.get("is_causal"):
        causal = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
    mask = call.get("attn_mask")
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(dtype)
    return scores


def pattern_of(scores: Tensor) -> Tensor:
    """Softmax over keys; a query that sees no key gets zeros (as TransformerLens does)."""
    pattern = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(pattern, nan=0.0)


def attend(pattern: Tensor, call: dict[str, Any], like: Tensor) -> Tensor:
    """``pattern @ v`` (v repeated per group under GQA), in ``like``'s dtype and layout."""
    v = call["value"]
    if v.shape[-3] != pattern.shape[-3]:
        v = v.repeat_interleave(pattern.shape[-3] // v.shape[-3], dim=-3)
    out = torch.matmul(pattern.to(v.dtype), v)
    return out.to(like.dtype)


ROLES = {"q": "query", "k": "key", "v": "value"}


class SdpaInput(Lens):
    """q, k or v as a fused attention call took them, ``[batch, pos, head, d_head]``: for a
    piece of a split (``qkv.chunk(3)``) that the graph does not tell apart. Read only."""

    identity = False

    derived = True

    editable = False

    def __init__(self, role: str):
        super().__init__(head_axis=2)
        self.role = role

    def read(self, value, args=(), kwargs=None):
        return sdpa_args(args, kwargs or {})[ROLES[self.role]].transpose(1, 2)


class SdpaScores(Lens):
    """``hook_attn_scores`` of a fused attention call, recomputed from its arguments."""

    identity = False

    derived = True

    def __init__(self) -> None:
        super().__init__(head_axis=1)

    def read(self, value, args=(), kwargs=None):
        return sdpa_scores(sdpa_args(args, kwargs or {})).to(value.dtype)

    def write(self, value, new, args=(), kwargs=None):
        call = sdpa_args(args, kwargs or {})
        return attend(pattern_of(new.to(torch.promote_types(new.dtype, torch.float32))), call,
                      value)


class SdpaPattern(Lens):
    """``hook_pattern`` of a fused attention call, recomputed from its arguments; writing one
    recomputes the call's output as ``pattern @ v``."""

    identity = False

    derived = True

    def __init__(self) -> None:
        super().__init__(head_axis=1)

    def read(self, value, args=(), kwargs=None):
        return pattern_of(sdpa_scores(sdpa_args(args, kwargs or {}))).to(value.dtype)

    def write(self, value, new, args=(), kwargs=None):
        return attend(new, sdpa_args(args, kwargs or {}), value)


# ---- flex attention ----------------------------------------------------------------------------

FLEX_ARGS = ("query", "key", "value", "score_mod", "block_mask", "scale", "enable_gqa",
             "return_lse", "kernel_options")
# what the recorder sees: flex_attention's higher-order op, called with the block mask as a
# tuple (its mask_mod last), the scale resolved, the mods' captured tensors passed apart
FLEX_HOP_ARGS = ("query", "key", "value", "score_mod", "block_mask", "scale", "kernel_options",
                 "score_mod_other_buffers", "mask_mod_other_buffers")


def flex_args(args: tuple, kwargs: dict) -> dict[str, Any]:
    """A flex attention call's arguments by name (of ``flex_attention`` itself or of the
    higher-order op it runs, whose block mask is a tuple), with ``mask_mod`` apart."""
    hop = len(args) > 4 and isinstance(args[4], tuple)
    bound = dict(zip(FLEX_HOP_ARGS if hop else FLEX_ARGS, args))
    bound.update(kwargs or {})
    mask = bound.get("block_mask")
    bound["mask_mod"] = mask[-1] if isinstance(mask, tuple) and mask else \
        getattr(mask, "mask_mod", None)
    bound["hop"] = hop
    return bound


def _over_grid(fn: Any, scores: bool, extra: int = 0) -> Any:
    """``fn`` vmapped over the ``[batch, head, q_idx, kv_idx]`` grid, as flex attention's eager
    implementation maps a ``score_mod`` (``scores``: its first argument is mapped too) or a
    ``mask_mod`` (``extra`` captured tensors after the indices, not mapped)."""
    prefix, suffix = (0,) if scores else (), (None,) * extra
    for dims in ((None, None, None, 0), (None, None, 0, None), (None, 0, None, None),
                 (0, None, None, None)):
        fn = torch.vmap(fn, in_dims=prefix + dims + suffix, out_dims=0)
    return fn


def _indexing() -> Any:
    """The context in which ``tensor[idx]`` inside a mod reads as ``torch.ops.aten.index`` (what
    flex attention traces its mods under, so a mod may index a captured tensor by q_idx)."""
    try:
        from torch._dynamo._trace_wrapped_higher_order_op import TransformGetItemToIndex
    except ImportError:  # pragma: no cover - older or newer torch: plain indexing
        return contextlib.nullcontext()
    return TransformGetItemToIndex()


def _refuse_flex(why: str) -> InputError:
    return InputError(
        f"this flex_attention call's scores cannot be recomputed: {why}; no pattern is given "
        "rather than one that is not the call's", code="site_not_in_architecture",
        teach=["score_mod and mask_mod as pure functions of (score, b, h, q_idx, kv_idx) and "
               "tensors that stay as they were during the call",
               "tl.trace(model, x, save='blocks.*.attn.hook_z')  # the call's output itself"])


def flex_scores(call: dict[str, Any]) -> Tensor:
    """The scores of a ``flex_attention`` call, ``[batch, head, q, k]``, in flex attention's
    working precision (float32, or float64 for float64 inputs): ``q k^T * scale``, then
    ``score_mod`` elementwise, then -inf where the block mask's ``mask_mod`` is False; k
    repeated per group under GQA."""
    q, k = call["query"], call["key"]
    precision = torch.float64 if q.dtype == torch.float64 else torch.float32
    if k.shape[-3] != q.shape[-3]:  # enable_gqa: each kv head serves a group of q heads
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    k = k.expand(q.shape[0], *k.shape[1:])  # a kv batch of 1 broadcast to the queries'
    scale = call.get("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q.to(precision) @ k.to(precision).transpose(-2, -1)) * scale
    grid = [torch.arange(n, device=scores.device) for n in scores.shape]
    score_mod, mask_mod = call.get("score_mod"), call.get("mask_mod")
    score_extra = tuple(call.get("score_mod_other_buffers") or ())
    mask_extra = tuple(call.get("mask_mod_other_buffers") or ())
    try:
        with _indexing():
            if score_mod is not None:
                scores = _over_grid(score_mod, True, len(score_extra))(
                    scores, *grid, *score_extra).to(precision)
            if mask_mod is not None:
                keep = _over_grid(mask_mod, False, len(mask_extra))(*grid, *mask_extra)
                scores = scores.masked_fill(~keep.to(torch.bool).expand_as(scores),
                                            float("-inf"))
    except TorchLensError:
        raise
    except Exception as err:  # a mod that cannot run again over the grid
        raise _refuse_flex(f"its {'score_mod' if mask_mod is None else 'score_mod or mask_mod'}"
                           f" raised {type(err).__name__} when evaluated over the "
                           f"[batch, head, q, k] grid ({err})") from err
    if tuple(scores.shape) != (q.shape[0], q.shape[-3], q.shape[-2], k.shape[-2]):
        raise _refuse_flex(f"its score_mod gave shape {list(scores.shape)}, not the grid's")
    return scores


def _flex_out(value: Any) -> Tensor:
    """The attention output of a flex call (it returns ``(out, lse)`` when asked for stats)."""
    return value[0] if isinstance(value, tuple) else value


def _checked(scores: Tensor, call: dict[str, Any], value: Any) -> Tensor:
    """``scores`` once ``softmax(scores) @ v`` is shown to be the call's own output (a mod
    reading a tensor changed since, a kernel masking by blocks alone, would not be)."""
    out = _flex_out(value)
    again = attend(pattern_of(scores), call, out)
    tol = max(1e-5, 4 * torch.finfo(out.dtype).eps) if out.is_floating_point() else 0.0
    if not torch.allclose(again, out, rtol=tol, atol=tol):
        gap = (again.double() - out.double()).abs().max().item()
        raise _refuse_flex(f"softmax(scores) @ v recomputed from its arguments differs from "
                           f"the call's output by {gap:.3g} (its mods read state that changed, "
                           "or the kernel masked by blocks that mask_mod does not express)")
    return scores


def _with_out(value: Any, out: Tensor, call: dict[str, Any], scores: Tensor | None = None
              ) -> Any:
    """The call's return with its output replaced; when the scores changed, its log-sum-exp
    and row maxima too (the higher-order op gives them in log2 units unless the kernel is
    FLASH's)."""
    if not isinstance(value, tuple):
        return out
    rest = list(value[1:])
    if scores is not None:
        units = 1.0
        if call["hop"] and (call.get("kernel_options") or {}).get("BACKEND") != "FLASH":
            units = math.log(2.0)
        stats = [torch.logsumexp(scores, dim=-1) / units, scores.amax(dim=-1) / units]
        for i, stat in enumerate(stats[:len(rest)]):
            if isinstance(rest[i], Tensor) and rest[i].shape == stat.shape:
                rest[i] = stat.to(rest[i].dtype)
    return (out, *rest)


# an output a flex lens's edit made -> the scores / pattern it was made from: what the names
# read there (the edited values the model went on with; the check against the call's output
# does not apply to an output the edit replaced)
# (keyed by id: a tensor's == is elementwise, so no weak-keyed mapping can hold it)
_EDITED: dict[int, tuple[Any, dict[str, Tensor]]] = {}


def _remember(out: Tensor, made: dict[str, Tensor]) -> None:
    key = id(out)
    _EDITED[key] = (weakref.ref(out, lambda _, key=key: _EDITED.pop(key, None)), made)


def _edited(value: Any) -> dict[str, Tensor] | None:
    out = _flex_out(value)
    found = _EDITED.get(id(out))
    return found[1] if found is not None and found[0]() is out else None


class FlexInput(SdpaInput):
    """q, k or v as a ``flex_attention`` call took them, ``[batch, pos, head, d_head]``."""

    def read(self, value, args=(), kwargs=None):
        return flex_args(args, kwargs or {})[ROLES[self.role]].transpose(1, 2)


class FlexScores(SdpaScores):
    """``hook_attn_scores`` of a ``flex_attention`` call: recomputed from its arguments as its
    eager implementation computes them (``score_mod`` applied, masked by ``mask_mod``) and
    checked against the call's output; an edit recomputes the call as ``softmax(new) @ v``."""

    def read(self, value, args=(), kwargs=None):
        call, edited = flex_args(args, kwargs or {}), _edited(value)
        if edited is not None:
            scores = edited.get("scores")
            scores = flex_scores(call) if scores is None else scores
        else:
            scores = _checked(flex_scores(call), call, value)
        return scores.to(_flex_out(value).dtype)

    def write(self, value, new, args=(), kwargs=None):
        call = flex_args(args, kwargs or {})
        scores = new.to(torch.promote_types(new.dtype, torch.float32))
        pattern = pattern_of(scores)
        out = attend(pattern, call, _flex_out(value))
        _remember(out, {"scores": scores.detach(), "pattern": pattern.detach()})
        return _with_out(value, out, call, scores)


class FlexPattern(SdpaPattern):
    """``hook_pattern`` of a ``flex_attention`` call (the softmax of ``FlexScores``); writing
    one recomputes the call's output as ``pattern @ v``."""

    def read(self, value, args=(), kwargs=None):
        edited = _edited(value)
        if edited is not None:
            return edited["pattern"].to(_flex_out(value).dtype)
        call = flex_args(args, kwargs or {})
        scores = _checked(flex_scores(call), call, value)
        return pattern_of(scores).to(_flex_out(value).dtype)

    def write(self, value, new, args=(), kwargs=None):
        call = flex_args(args, kwargs or {})
        out = attend(new, call, _flex_out(value))
        _remember(out, {"pattern": new.detach()})
        return _with_out(value, out, call)
