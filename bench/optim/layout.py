"""Where the gradients of a flat bucket live: :func:`plan` reads DDP's bucket layout off
the gradients (``gradient_as_bucket_view``) and the flat buffers are re-laid in its order,
so a whole DDP bucket is updated with its own tensor as the gradient.
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
    """``(order, tile_lengths)``: every tile first, then the others by param group."""
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
        if len(entries) < 2 and not grads[entries[0][1]]._is_view():
            continue  # a gradient of its own (autograd's): the copying path
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


def ddp_like_buckets(
    params: list[torch.Tensor], cap_mb: float = 25.0, first_mb: float = 1.0
) -> list[torch.Tensor]:
    """Give ``params`` gradients laid out as DDP's first buckets (``gradient_as_bucket_view``),
    without a process group (benchmarks, tests)."""
    open_: dict[tuple, list[torch.Tensor]] = {}
    done: list[list[torch.Tensor]] = []
    for p in params:
        key = (p.device, p.dtype)
        cur = open_.setdefault(key, [])
        cur.append(p)
        limit = (first_mb if not done else cap_mb) * 2**20
        if sum(q.numel() for q in cur) * p.element_size() >= limit:
            done.append(open_.pop(key))
    done += [ps for ps in open_.values() if ps]
    buckets = []
    for ps in done:
        flat = torch.zeros(sum(p.numel() for p in ps), dtype=ps[0].dtype, device=ps[0].device)
        off = 0
        for p in ps:
            view = dense_view(flat, off, p)
            if p.grad is not None:
                view.copy_(p.grad)
            p.grad = view
            off += p.numel()
        buckets.append(flat)
    return buckets


@dataclass
class Whole:
    """One update over all of segment ``segment`` for its major ``runs``; ``others``: its
    flat positions outside them, saved and put back."""

    segment: int
    runs: list[tuple[int, int, int]]
    others: torch.Tensor
    minor: list[tuple[int, int, int]]  # the other runs, updated after
    compact: bool  # the other runs are one class and all of ``others``
    local: torch.Tensor  # ``others`` within the segment (into its gradient)


def schedule(b, runs: list[tuple[int, int, int]], keys: list) -> list[tuple]:
    """The updates of a step of bucket ``b``."""
    by_seg: dict[int, list[tuple[int, int, int]]] = {}
    out: list[tuple] = []
    for r in runs:
        s = b.seg_of[r[1]]
        if s < 0:
            out.append((*r, None))
        else:
            by_seg.setdefault(s, []).append(r)
    for s, rs in by_seg.items():
        if len(rs) < 3:
            out += [(*r, None) for r in rs]
            continue
        size: dict[tuple, int] = {}
        for g, i, j in rs:
            c = (g, keys[i])
            size[c] = size.get(c, 0) + b.end(j) - b.offsets[i]
        major = max(size, key=lambda c: size[c])
        seg = b.segments[s]
        if 2 * size[major] < seg.end - seg.start:
            out += [(*r, None) for r in rs]
            continue
        mine = [r for r in rs if (r[0], keys[r[1]]) == major]
        minor = [r for r in rs if (r[0], keys[r[1]]) != major]
        key = (s, tuple(mine), tuple(minor))
        if key not in b.whole_cache:
            mask = torch.ones(seg.end - seg.start, dtype=torch.bool)
            for _, i, j in mine:
                mask[b.offsets[i] - seg.start : b.end(j) - seg.start] = False
            others = (mask.nonzero().flatten() + seg.start).to(b.device)
            one = len({(g, keys[i]) for g, i, _ in minor}) == 1
            covered = sum(b.end(j) - b.offsets[i] for _, i, j in minor) == others.numel()
            if len(b.whole_cache) > 4 * len(b.segments):  # state ages changing: bound it
                b.whole_cache.clear()
            w = Whole(s, mine, others, minor, one and covered, others - seg.start)
            b.whole_cache[key] = w
        out.append((major[0], mine[0][1], 0, b.whole_cache[key]))
    return out
