"""Where this process's part of a value lies in the whole: a DTensor's placement, or, for a plain
tensor computed from shards between DTensor regions (``to_local`` ... ``from_local``), the
dimension it is split along, followed through the ops in between.

A layout is ``(kind, dim, mesh, whole_shape)``: kind ``"shard"`` (split along ``dim`` into the
mesh's ranks, in rank order) or ``"partial"`` (each rank holds a summand). A replicated value has
no layout. Meshes of one dimension only (``init_device_mesh("cpu", (2,))``).
"""

from __future__ import annotations

from math import prod
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

Layout = tuple  # (kind, dim, mesh, whole_shape)

# ops that move dimensions: how an input dimension maps to the output's
_MOVES = {"transpose", "swapaxes", "swapdims", "t", "permute", "movedim"}


def of_dtensor(t: DTensor) -> Layout | None:
    """The layout of a DTensor's local tensor (None: replicated)."""
    placement = t.placements[0]
    if isinstance(placement, Shard):
        return ("shard", placement.dim % t.ndim, t.device_mesh, tuple(t.shape))
    if isinstance(placement, Partial):
        return ("partial", None, t.device_mesh, tuple(t.shape))
    return None


def placements_of(layout: Layout) -> list:
    """The DTensor placements a layout stands for."""
    return [Shard(layout[1])] if layout[0] == "shard" else [Partial()]


def _moved(name: str, args: tuple, kwargs: dict, dim: int, ndim: int) -> int | None:
    """Where ``dim`` of a transpose/permute's input is in its output."""
    rest = [a for a in args[1:]]
    if name == "t":
        return 1 - dim if ndim == 2 else dim
    if name in ("transpose", "swapaxes", "swapdims"):
        a, b = (rest + [kwargs.get("dim0"), kwargs.get("dim1")])[:2]
        if a is None or b is None:
            return None
        a, b = a % ndim, b % ndim
        return b if dim == a else a if dim == b else dim
    if name == "permute":
        order = rest[0] if len(rest) == 1 and isinstance(rest[0], (tuple, list)) else rest
        order = [d % ndim for d in order]
        return order.index(dim) if dim in order else None
    return None


def infer(name: str, args: tuple, kwargs: dict, out: torch.Tensor,
          layout_of: Any) -> Layout | None | bool:
    """The layout of ``out``, a plain tensor an op made from ``args``: None when no input is
    sharded, False when one is but where ``out`` is split cannot be told."""
    found = False
    for a in list(args) + list(kwargs.values()):
        items = a if isinstance(a, (tuple, list)) else (a,)
        for t in items:
            if not isinstance(t, torch.Tensor):
                continue
            layout = layout_of(t)
            if layout is None:
                continue
            found = True
            got = _follow(name, args, kwargs, t, layout, out)
            if got is not None:
                return got
    return False if found else None


def _follow(name: str, args: tuple, kwargs: dict, t: torch.Tensor, layout: Layout,
            out: torch.Tensor) -> Layout | None:
    kind, dim, mesh, _ = layout
    n = mesh.size()
    shape, got = tuple(t.shape), tuple(out.shape)
    if kind == "partial":  # a summand stays one while the op keeps its shape (a scale, a cast)
        return ("partial", None, mesh, got) if got == shape else None
    whole = lambda d: got[:d] + (got[d] * n,) + got[d + 1:]  # noqa: E731
    if got == shape:
        return ("shard", dim, mesh, whole(dim))
    if name in _MOVES:
        moved = _moved(name, args, kwargs, dim, len(shape))
        return ("shard", moved, mesh, whole(moved)) if moved is not None else None
    if len(got) == len(shape) and got[dim] == shape[dim]:  # a matmul, an attention over heads
        return ("shard", dim, mesh, whole(dim))
    if out.numel() == t.numel():  # a view or reshape: the dimension whose elements start where
        # the split one's did, holding whole rows of it (heads split out, or merged back)
        before = prod(shape[:dim])
        for k in range(len(got)):
            if prod(got[:k]) == before and got[k] > 0 and (
                    shape[dim] % got[k] == 0 or got[k] % shape[dim] == 0):
                return ("shard", k, mesh, whole(k))
    return None


def gather(value: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The whole of a plain tensor that is this rank's part under ``layout`` (a collective:
    every rank calls it, in the same order)."""
    local = DTensor.from_local(value, layout[2], placements_of(layout), run_check=False)
    return plain(local.full_tensor())


def gather_many(items: list[tuple[torch.Tensor, Layout | None]]) -> list[torch.Tensor]:
    """The whole values of many local parts at once, in the order given: one all_gather per
    mesh and dtype for the shards, one all_reduce per mesh and dtype for the partial sums
    (every rank gives the same items, so the groups and their order agree). A part that is
    not an even split of its whole is gathered on its own."""
    import torch.distributed as dist

    out: list = [None] * len(items)
    groups: dict[tuple, list[int]] = {}
    for i, (local, layout) in enumerate(items):
        if not layout:
            out[i] = plain(local)
            continue
        kind, dim, mesh, whole = layout
        if kind == "shard":
            split = list(local.shape)
            split[dim] *= mesh.size()
            if tuple(split) != tuple(whole):
                out[i] = gather(local, layout)
                continue
        groups.setdefault((kind, id(mesh), local.dtype), []).append(i)
    for (kind, _, _), members in groups.items():
        locals_ = [plain(items[i][0]).detach() for i in members]
        mesh = items[members[0]][1][2]
        group = mesh.get_group()
        flat = torch.cat([t.reshape(-1) for t in locals_])
        if kind == "partial":
            dist.all_reduce(flat, group=group)
            parts = [flat]
        else:
            parts = [torch.empty_like(flat) for _ in range(mesh.size())]
            dist.all_gather(parts, flat, group=group)
        offset = 0
        for i, t in zip(members, locals_):
            n = t.numel()
            pieces = [p[offset:offset + n].view(t.shape) for p in parts]
            out[i] = pieces[0].clone() if kind == "partial" else torch.cat(
                pieces, dim=items[i][1][1])
            offset += n
    return out


def plain(value: torch.Tensor) -> torch.Tensor:
    """A plain tensor of ``value`` (an AsyncCollectiveTensor waited for)."""
    wait = getattr(value, "trigger_wait", None)
    if wait is not None:
        value = wait()
    return value if type(value) is torch.Tensor else value.as_subclass(torch.Tensor)


def whole_of(value: Any, layout: Layout | None) -> torch.Tensor:
    """The whole value of a DTensor or of a plain tensor with a layout."""
    if isinstance(value, DTensor):
        placement = value.placements[0]
        if isinstance(placement, Partial) and type(placement) is not Partial:
            # a partial sum with state of its own (an embedding's _MaskPartial, whose mask
            # the forward's reduction used up, having masked the local tensor in place)
            value = DTensor.from_local(value._local_tensor, value.device_mesh,
                                       [Partial(placement.reduce_op)], run_check=False)
        return plain(value.full_tensor())
    return gather(value, layout) if layout else plain(value)


def split(whole: torch.Tensor, like: Any, layout: Layout | None) -> Any:
    """This rank's part of an edited whole value, in the form the forward held it: a DTensor of
    the same placement (a partial sum becomes replicated: the same whole), or the local part."""
    if isinstance(like, DTensor):
        mesh, placement = like.device_mesh, like.placements[0]
        if isinstance(placement, Shard):
            part = whole.chunk(mesh.size(), placement.dim)[mesh.get_local_rank()].contiguous()
            return DTensor.from_local(part, mesh, [placement], run_check=False,
                                      shape=whole.shape, stride=whole.stride())
        return DTensor.from_local(whole, mesh, [Replicate()], run_check=False)
    if layout is None:
        return whole
    mesh = layout[2]
    if layout[0] == "shard":
        return whole.chunk(mesh.size(), layout[1])[mesh.get_local_rank()].contiguous()
    return whole if mesh.get_local_rank() == 0 else torch.zeros_like(whole)
