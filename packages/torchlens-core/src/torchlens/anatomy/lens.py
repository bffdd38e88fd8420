"""How a transformer name reads and writes the tensor it stands on.

A name stands on an op's output (its *anchor*). The lens reads the name's value from it in
TransformerLens's layout (a view where it can be one: the reshape that splits heads, the
transpose to ``[batch, pos, head, d_head]``) and writes an edited value back into the anchor's
layout, so an edit of the name is an edit of the real tensor the model goes on with. The
attention lenses of a fused ``scaled_dot_product_attention`` call recompute the scores and the
pattern exactly from that call's q, k, mask, causal flag, scale and GQA repeat, and an edited
pattern recomputes the call as ``pattern @ v``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..errors import EditError


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
