"""Where the gradients of a flat bucket live: DDP's bucket buffers, found at step time.

With ``DistributedDataParallel(..., gradient_as_bucket_view=True)`` DDP makes every
``p.grad`` a view into the flat gradient tensor of its communication bucket (the
parameters of a bucket lie one after the other, in bucket order; DDP may rebuild its
buckets once, after the first iteration, in gradient-ready order).  A flat optimizer
that lays its own model/master/state buffers out in the same order can then update a
whole bucket with the bucket tensor itself as the gradient: no gradient is copied
between backward and update.

:func:`plan` reads the layout off the gradients: a *tile* is a maximal run of this
bucket's parameters whose gradients tile one foreign storage (a DDP bucket) without
gaps, in storage order.  The flat buffers are then re-laid (:func:`permute`) with the
tiles first, each as one contiguous range, and the other parameters (no gradient, a
gradient of its own: the copying path) after them, ordered by param group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def dense_view(flat: torch.Tensor, offset: int, like: torch.Tensor) -> torch.Tensor:
    """A view of ``flat[offset : offset + like.numel()]`` with ``like``'s shape and strides."""
    return flat.as_strided(like.size(), like.stride(), flat.storage_offset() + offset)


def is_dense(p: torch.Tensor) -> bool:
    if p.is_contiguous():
        return True
    if p.ndim == 4 and p.is_contiguous(memory_format=torch.channels_last):
        return True
    return p.ndim == 5 and p.is_contiguous(memory_format=torch.channels_last_3d)


@dataclass
class Segment:
    """One tile: parameters ``i..j-1`` at flat range ``start:end``, whose gradients are
    the consecutive values of ``grad`` (a 1-D view into the DDP bucket)."""

    i: int
    j: int
    start: int
    end: int
    grad: torch.Tensor


def _viewable(p: torch.Tensor, g: torch.Tensor | None, dtype: torch.dtype) -> bool:
    return (
        g is not None
        and g.dtype == dtype
        and g.device == p.device
        and g.shape == p.shape
        and g.stride() == p.stride()
        and p.numel() > 0
    )


def plan(
    params: list[torch.Tensor],
    grads: list[torch.Tensor | None],
    group_ids: list[int],
    dtype: torch.dtype,
    own: torch.Tensor,
) -> tuple[list[int], list[int]]:
    """``(order, tile_lengths)``: the parameter order that puts every tile first, each
    as a run of ``tile_lengths[t]`` parameters, then the others by param group.

    A storage holding the gradients of at least two of these parameters (other than the
    bucket's own gradient buffer ``own``) is split into tiles: runs of gradients that
    follow each other without a gap (a gap: a parameter of another optimizer, or of
    another dtype).  Overlapping gradients are never tiled.
    """
    own_ptr = own.untyped_storage().data_ptr()
    by_storage: dict[int, list[tuple[int, int]]] = {}
    for k, (p, g) in enumerate(zip(params, grads, strict=True)):
        if not _viewable(p, g, dtype):
            continue
        ptr = g.untyped_storage().data_ptr()
        if ptr != own_ptr:
            by_storage.setdefault(ptr, []).append((g.storage_offset(), k))
    tiles: list[list[int]] = []
    for entries in by_storage.values():
        if len(entries) < 2:
            continue
        entries.sort()
        ends = [off + params[k].numel() for off, k in entries]
        if any(entries[n + 1][0] < ends[n] for n in range(len(entries) - 1)):
            continue  # overlapping gradients: not a bucket layout
        tile = [entries[0][1]]
        for n in range(1, len(entries)):
            if entries[n][0] != ends[n - 1]:
                tiles.append(tile)
                tile = []
            tile.append(entries[n][1])
        tiles.append(tile)
    tiled = {k for t in tiles for k in t}
    rest = sorted((k for k in range(len(params)) if k not in tiled), key=lambda k: group_ids[k])
    return [k for t in tiles for k in t] + rest, [len(t) for t in tiles]


def segments(
    grads: list[torch.Tensor | None], offsets: list[int], numels: list[int], lengths: list[int]
) -> list[Segment]:
    """The tiles of a bucket already laid out by :func:`plan` (tiles first, in order)."""
    out = []
    i = 0
    for n in lengths:
        j = i + n
        start, end = offsets[i], offsets[j - 1] + numels[j - 1]
        g0 = grads[i]
        assert g0 is not None
        flat = g0.as_strided((end - start,), (1,), g0.storage_offset())
        out.append(Segment(i, j, start, end, flat))
        i = j
    return out


def permute(flat: torch.Tensor, perm: list[int], old: list[int], new: list[int], numels: list[int]):
    """A new flat buffer whose range of parameter ``n`` (at ``new[n]``) holds the old
    buffer's range of parameter ``perm[n]`` (at ``old[perm[n]]``)."""
    out = torch.empty_like(flat)
    for n, k in enumerate(perm):
        out[new[n] : new[n] + numels[k]].copy_(flat[old[k] : old[k] + numels[k]])
    return out


@torch.no_grad()
def relayout(b, perm: list[int]) -> None:
    """Re-lay a :class:`~bench.optim.flat.FlatBucket` ``b`` in place: its parameter ``n``
    becomes the old parameter ``perm[n]``; every flat buffer is moved (one copy per
    parameter, once), ``p.data`` and the ``p.grad`` that were views follow."""
    old_offsets, numels, old_views = b.offsets, b.numels, b.grad_views
    b.params = [b.params[k] for k in perm]
    b.numels = [numels[k] for k in perm]
    b.group_ids = [b.group_ids[k] for k in perm]
    b.initialized = [b.initialized[k] for k in perm]
    b.offsets = [0]
    for n in b.numels[:-1]:
        b.offsets.append(b.offsets[-1] + n)

    def moved(flat: torch.Tensor) -> torch.Tensor:
        return permute(flat, perm, old_offsets, b.offsets, numels)

    master = moved(b.master)
    b.model = moved(b.model) if b.has_master else master
    b.master = master
    b.grad = moved(b.grad)
    b.grad32 = torch.empty_like(master) if b.grad32 is not None else None
    b.state = {name: moved(buf) for name, buf in b.state.items()}
    b.grad_views = [dense_view(b.grad, o, p) for p, o in zip(b.params, b.offsets, strict=True)]
    for n, p in enumerate(b.params):
        own = p.grad is not None and p.grad is old_views[perm[n]]
        p.data = dense_view(b.model, b.offsets[n], p)
        if own:
            p.grad = b.grad_views[n]
