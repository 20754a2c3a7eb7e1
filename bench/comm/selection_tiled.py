"""MSTopK's ``tiled`` method (the default) and ``sampled``, on the CPU and on CUDA.

``tiled`` (exact): ``x`` viewed as a ``(C, R)`` matrix; the column maxima of ``|x|`` say
which few columns can hold the top k, and only those are gathered.  On the CPU the column
maxima take one sweep over column chunks of a few MiB: ``amax`` streams a chunk from memory,
``amin`` rereads it from the cache, so ``x`` is read from memory once (no ``|x|`` is
materialised); the error-feedback form adds the gradient into the residual in the same
sweep.  ``sampled`` (exact): a threshold from a strided sample of ``|x|``, one compare pass
for the candidates.  Both end with an exact top-k over candidates that contain the top k.

The ``_dev`` functions are the CUDA structure (one host sync per call, no other
data-dependent shape); ``_device_path`` selects them anywhere (tests run them on the CPU).
"""

from __future__ import annotations

import threading

import torch

from bench.comm.selection_core import (
    exact,
    nonzero,
    raise_unless,
    sample_threshold,
    top_of_candidates,
    triton_run,
)

CHUNK_BYTES = 4 << 20  # one chunk of columns of the (C, R) view: stays in the cache


def rows_for(n: int, k: int, tiles: int) -> int:
    """Rows ``C`` of the view: enough that a column rarely holds two of the top k (fewer
    gathered elements per hit), few enough that the column maxima stay >> k (16 at 0.1 %)."""
    return min(tiles, n // (8 * k))


def sampled(
    flat: torch.Tensor, k: int, sample: int, margin: float, gen: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    n = flat.numel()
    a = flat.abs()
    raise_unless(torch.isfinite(a.max()))
    for attempt in range(3):
        thr = sample_threshold(a, k * margin * (4**attempt) / n, sample, gen)
        cand = nonzero(a >= thr)
        if cand.numel() >= k:
            return top_of_candidates(flat, cand, a[cand], k)
    return exact(flat, k)


def sampled_dev(
    flat: torch.Tensor, k: int, sample: int, margin: float, gen: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sampled`` with one sync: finiteness folded into the one data-dependent compaction."""
    n = flat.numel()
    a = flat.abs()
    finite = torch.isfinite(a.amax())
    thr = sample_threshold(a, k * margin / n, sample, gen, z=3.0)
    # NaN threshold when x is not finite: nothing compares >= NaN, no candidates
    cand = nonzero(a >= torch.where(finite, thr, float("nan")))
    if cand.numel() >= k:
        return top_of_candidates(flat, cand, a[cand], k)
    raise_unless(finite)  # rare: an unlucky sample (or x is not finite)
    return exact(flat, k)


def _sample_of_sum(
    flat: torch.Tensor, add: torch.Tensor | None, q_frac: float, sample: int, gen
) -> torch.Tensor:
    """:func:`sample_threshold` of ``|flat + add|`` (``add`` may be None) aiming at a
    fraction ``q_frac``, with 2 standard deviations to spare: the sum only where sampled."""
    if add is None:
        return sample_threshold(flat, q_frac, sample, gen, z=2.0, absolute=True)
    n = flat.numel()
    step = max(1, n // min(n, sample))
    off = int(torch.randint(0, step, (1,), generator=gen)) if step > 1 else 0
    part = flat[off::step][:sample] + add[off::step][:sample]
    return sample_threshold(part, q_frac, sample, None, z=2.0, absolute=True)


def _gather(head: torch.Tensor, cols: torch.Tensor, thr: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Flat indices and magnitudes of the elements ``>= thr`` of ``head``'s columns ``cols``."""
    g = head.index_select(1, cols).abs_()  # row by row, rising addresses
    rows, pos = nonzero(g >= thr)
    return rows * head.shape[1] + cols[pos], g[rows, pos]


_WORK = threading.local()  # per-thread buffers reused across calls (see _buffer)


def _buffer(slot: str, numel: int, like: torch.Tensor) -> torch.Tensor:
    """A 1-D buffer of ``numel`` elements of ``like``'s dtype and device, kept for the next
    call: a fresh tensor of many MiB costs a page fault per 4 KiB on its first touch."""
    cache = _WORK.__dict__.setdefault("buffers", {})
    key = (slot, like.dtype, like.device)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = like.new_empty(numel)
    return buf[:numel]


def _chunk_columns(c: int, r: int, itemsize: int) -> int:
    """Columns per chunk: a few MiB with one intra-op thread; all of them with more, where
    every op is a parallel region that waits for its slower thread, and on a loaded machine
    a few hundred small regions cost whole scheduler slices (25.6 M elements with 2 threads
    took 6.5 s in 4 MiB chunks, 80x a read pass)."""
    if torch.get_num_threads() > 1:
        return r
    return max(1, CHUNK_BYTES // (c * itemsize))


def _sweep(
    head: torch.Tensor, thr: torch.Tensor, add: torch.Tensor | None
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """One pass over column chunks of ``head`` (``+= add`` first): the column maxima of
    ``|x|`` (``amax`` streams a chunk from memory, ``amin`` rereads it from the cache; no
    ``|x|`` is materialised) and the flat indices and magnitudes of the elements ``>= thr``,
    gathered from the columns whose maximum reaches it while the chunk is still cached."""
    c, r = head.shape
    w = _chunk_columns(c, r, head.element_size())
    colmax = _buffer("colmax", r, head)
    low = _buffer("low", min(w, r), head)
    idx: list[torch.Tensor] = []
    mag: list[torch.Tensor] = []
    for j in range(0, r, w):
        chunk = head[:, j : j + w]
        if add is not None:
            chunk.add_(add[:, j : j + w])
        m = colmax[j : j + w]
        s = low[: m.numel()]
        torch.amax(chunk, 0, out=m)
        torch.amin(chunk, 0, out=s)
        torch.maximum(m, s.neg_(), out=m)
        cols = nonzero(m >= thr)
        if cols.numel():
            i, a = _gather(head, cols.add_(j), thr)
            idx.append(i)
            mag.append(a)
    return colmax, idx, mag


def _candidate_columns(
    colmax: torch.Tensor, k: int, sample: int, margin: float, gen: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """A threshold ``thr`` and the columns whose maximum reaches it, at least ``k`` of them."""
    r = colmax.numel()
    for attempt in range(3):
        thr = sample_threshold(colmax, k * margin * (4**attempt) / r, sample, gen)
        cols = nonzero(colmax >= thr)
        if cols.numel() >= k:
            return thr, cols
    # unlucky samples: the k-th largest column maximum is always safe
    thr = torch.topk(colmax.float(), k, sorted=False).values.min().to(colmax.dtype)
    return thr, nonzero(colmax >= thr)


def tiled(
    flat: torch.Tensor,
    k: int,
    tiles: int,
    sample: int,
    margin: float,
    gen: torch.Generator | None,
    add: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tiled`` on the CPU; ``add`` (flat, like ``flat``): ``flat += add`` first, fused.

    A threshold aimed at ``margin * k`` elements comes first, from a strided sample; one
    sweep then yields the column maxima and every element at or above it.  Rarely (an
    unlucky sample) fewer than ``k`` are: a threshold from the column maxima follows."""
    n = flat.numel()
    c = rows_for(n, k, tiles)
    if c < 2:
        return sampled(flat if add is None else flat.add_(add), k, sample, margin, gen)
    r = n // c
    head, tail = flat[: c * r].view(c, r), flat[c * r :]  # tail: < C elements, all candidates
    if add is not None:
        tail.add_(add[c * r :])
    thr = _sample_of_sum(flat, add, k * margin / n, sample, gen)
    colmax, idx, mag = _sweep(head, thr, None if add is None else add[: c * r].view(c, r))
    raise_unless(torch.isfinite(colmax.max()) & torch.isfinite(tail).all())
    if sum(i.numel() for i in idx) + tail.numel() < k:
        thr, cols = _candidate_columns(colmax, k, sample, margin, gen)
        i, a = _gather(head, cols, thr)
        idx, mag = [i], [a]
    # every element >= thr is in a column whose maximum is >= thr: the candidates are
    # exactly {i : |x_i| >= thr} (and the tail), at least k of them, a superset of the top k
    if tail.numel():
        idx.append(torch.arange(c * r, n, device=flat.device))
        mag.append(tail.abs())
    return top_of_candidates(flat, torch.cat(idx), torch.cat(mag), k)


def colmax_dev(head: torch.Tensor, kernel: str) -> torch.Tensor:
    """Column max ``|x|`` of the ``(C, R)`` view (float32; float64 kept); NaN propagates."""
    out = triton_run("colmax", kernel, head, lambda t: t.colmax_abs(head))
    if out is not None:
        return out
    m = torch.maximum(torch.amax(head, 0), torch.amin(head, 0).neg_())
    return m if m.dtype == torch.float64 else m.float()


def tiled_dev(
    flat: torch.Tensor, k: int, tiles: int, sample: int, margin: float, gen, kernel: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tiled`` with one sync (the finiteness flag) and no data-dependent shape.  Exact: of
    the k columns with the largest maxima, those above the k-th largest value v hold every
    element > v, and the rest (maximum v) enough elements equal to v."""
    n = flat.numel()
    c = rows_for(n, k, tiles)
    if c < 2:
        return sampled_dev(flat, k, sample, margin, gen)
    r = n // c
    head = flat[: c * r].view(c, r)
    tail = flat[c * r :]
    colmax = colmax_dev(head, kernel)
    finite = torch.isfinite(colmax.amax()) & torch.isfinite(tail).all()
    cols = torch.topk(colmax, k, sorted=False).indices
    cand_abs = head.index_select(1, cols).abs_().float().reshape(-1)
    cand_idx = (torch.arange(c, device=flat.device)[:, None] * r + cols).reshape(-1)
    if tail.numel():
        cand_idx = torch.cat([cand_idx, torch.arange(c * r, n, device=flat.device)])
        cand_abs = torch.cat([cand_abs, tail.abs().float()])
    out = top_of_candidates(flat, cand_idx, cand_abs, k)
    raise_unless(finite)
    return out
