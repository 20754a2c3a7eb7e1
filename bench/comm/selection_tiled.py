"""MSTopK's ``tiled`` method (the default; exact): on the CPU a threshold from a sample of
``|x|`` and every element above it in one numpy sweep, on CUDA a radix select of group
maxima (Triton) or the column maxima of a ``(C, R)`` view; and ``sampled`` (exact): a
threshold from a strided sample, one compare pass (docs/internals/comm.md).
"""

from __future__ import annotations

import threading

import numpy as np
import torch
from torch import Generator, Tensor

from bench.comm.selection_core import (
    exact,
    host,
    nonzero,
    raise_unless,
    sample_threshold,
    top_of_candidates,
    triton_run,
)

BLOCK_BYTES = 1 << 20  # one block of the CPU sweep: C rows of w adjacent columns
GROUP_BLOCKS = 4  # blocks whose columns are compacted and gathered together
NP_DTYPES = (torch.float32, torch.float64)  # swept by numpy (no bfloat16; float16 is slow)
NP_CHUNK_BYTES = 2 << 20  # one piece of the numpy sweep: stays in the cache
RUN = 16  # adjacent elements per run of the threshold sample: a 64-byte line of float32


def rows_for(n: int, k: int, tiles: int) -> int:
    """Rows ``C`` of the view: enough that a column rarely holds two of the top k (fewer
    gathered elements per hit), few enough that the column maxima stay >> k (16 at 0.1 %)."""
    return min(tiles, n // (8 * k))


def _above_sampled(
    a: Tensor, k: int, sample: int, margin: float, gen: Generator | None
) -> tuple[Tensor, Tensor] | None:
    """A sampled threshold and the entries of ``a`` at or above it, at least ``k`` of them
    (3 tries, each aiming 4 times higher); None after unlucky samples."""
    for attempt in range(3):
        thr = sample_threshold(a, k * margin * (4**attempt) / a.numel(), sample, gen)
        cand = nonzero(a >= thr)
        if cand.numel() >= k:
            return thr, cand
    return None


def sampled(
    flat: Tensor, k: int, sample: int, margin: float, gen: Generator | None
) -> tuple[Tensor, Tensor]:
    a = flat.abs()
    raise_unless(torch.isfinite(a.max()))
    found = _above_sampled(a, k, sample, margin, gen)
    if found is None:
        return exact(flat, k)
    return top_of_candidates(flat, found[1], a[found[1]], k)


def sampled_dev(
    flat: Tensor, k: int, sample: int, margin: float, gen: Generator | None
) -> tuple[Tensor, Tensor]:
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


def _sample_of_sum(flat: Tensor, add: Tensor | None, q_frac: float, sample: int, gen) -> Tensor:
    """:func:`sample_threshold` of ``|flat + add|`` (``add`` may be None), 2 standard
    deviations to spare, from runs of :data:`RUN` adjacent elements where they fit."""
    n = flat.numel()
    runs = min(n, sample) // RUN
    step = n // max(1, runs)
    if runs < 1 or step < 2 * RUN:  # too few or too close for runs: single elements
        part = flat if add is None else flat + add
        return sample_threshold(part, q_frac, sample, gen, z=2.0, absolute=True)
    off = int(torch.randint(0, step - RUN + 1, (1,), generator=gen))

    def pick(t: Tensor) -> Tensor:
        return t[: runs * step].view(runs, step)[:, off : off + RUN]

    part = pick(flat) if add is None else pick(flat) + pick(add)
    return sample_threshold(part.reshape(-1), q_frac, part.numel(), None, z=2.0, absolute=True)


def _gather(flat: Tensor, cols: Tensor, thr: Tensor, c: int, w: int) -> tuple[Tensor, ...]:
    """Flat indices and values of the elements ``|x| >= thr`` of the columns ``cols``."""
    first = cols.div(w, rounding_mode="floor").mul_(c * w - w).add_(cols)  # row 0's element
    idx = (first[:, None] + torch.arange(0, c * w, w, device=flat.device)).view(-1)
    g = flat.index_select(0, idx)
    f = nonzero(g.abs() >= thr)
    return idx[f], g[f]


_WORK = threading.local()  # per-thread buffers reused across calls (see _buffer)


def _buffer(slot: str, numel: int, like: Tensor) -> Tensor:
    """A 1-D buffer of ``numel`` elements of ``like``'s dtype and device, kept for the next
    call: a fresh tensor of many MiB costs a page fault per 4 KiB on its first touch."""
    cache = _WORK.__dict__.setdefault("buffers", {})
    key = (slot, like.dtype, like.device)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = like.new_empty(numel)
    return buf[:numel]


def _sweep(
    flat: Tensor, head: Tensor, thr: Tensor, add: Tensor | None
) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """One pass over the ``(nb, c, w)`` blocks ``head`` of ``flat`` (``+= add`` first)."""
    nb, c, w = head.shape
    colmax = _buffer("colmax", nb * w, flat).view(nb, w)
    low = _buffer("low", min(nb, GROUP_BLOCKS) * w, flat).view(-1, w)
    idx: list[Tensor] = []
    val: list[Tensor] = []
    for b0 in range(0, nb, GROUP_BLOCKS):
        b1 = min(nb, b0 + GROUP_BLOCKS)
        for b in range(b0, b1):
            if add is not None:
                head[b].add_(add[b])
            torch.amax(head[b], 0, out=colmax[b])
            torch.amin(head[b], 0, out=low[b - b0])
        m = colmax[b0:b1]
        torch.maximum(m, low[: b1 - b0].neg_(), out=m)
        cols = nonzero(m.view(-1) >= thr)
        if cols.numel():
            i, v = _gather(flat, cols.add_(b0 * w), thr, c, w)
            idx.append(i)
            val.append(v)
    return colmax.view(-1), idx, val


def tiled(
    flat: Tensor,
    k: int,
    tiles: int,
    sample: int,
    margin: float,
    gen: Generator | None,
    add: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``tiled`` on the CPU, ``flat += add`` fused: the numpy pass for float32 and float64,
    else (or after an unlucky sample there) :func:`_tiled_torch`."""
    n = flat.numel()
    add = None if add is None else add.reshape(-1)  # the gradient keeps its own shape
    c = rows_for(n, k, tiles)
    if c < 2:
        return sampled(flat if add is None else flat.add_(add), k, sample, margin, gen)
    if flat.dtype in NP_DTYPES:
        t = host(_sample_of_sum(flat, add, k * margin / n, sample, gen))
        if not t > 0:  # mostly zeros (every element would be a candidate), or NaN sampled
            return exact(flat if add is None else flat.add_(add), k)
        idx, val = _above_np(
            flat.detach().numpy(), None if add is None else add.detach().numpy(), t
        )
        if sum(i.size for i in idx) >= k:
            idx, val = np.concatenate(idx), np.concatenate(val)
            mag = np.abs(val)
            # NaN, Inf: always candidates; read here (a CPU array: no device), since the
            # mask below would keep fewer than k of a non-finite one
            raise_unless(torch.isfinite(torch.from_numpy(mag).amax()), deferrable=False)
            kth = np.partition(mag, mag.size - k)[mag.size - k]  # a mask of k of the largest
            keep = mag > kth
            keep[np.nonzero(mag == kth)[0][: k - int(np.count_nonzero(keep))]] = True
            return torch.from_numpy(val[keep]), torch.from_numpy(idx[keep])
        add = None  # an unlucky sample: the column structure below, flat += add done
    return _tiled_torch(flat, k, c, sample, margin, gen, add)


def _tiled_torch(
    flat: Tensor,
    k: int,
    c: int,
    sample: int,
    margin: float,
    gen: Generator | None,
    add: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """``tiled`` in torch ops: a sampled threshold aimed at ``margin * k`` elements, one
    sweep over blocks of ``c`` rows for the column maxima and every element above it; after
    an unlucky sample, a threshold from the column maxima."""
    n = flat.numel()
    # nb blocks of c rows of w columns (docs/internals/comm.md)
    nb = 1 if torch.get_num_threads() > 1 else max(1, round(n * flat.element_size() / BLOCK_BYTES))
    w = n // (c * nb)
    h = nb * c * w
    head, tail = flat[:h].view(nb, c, w), flat[h:]  # tail: < nb * c elements, all candidates
    if add is not None:
        tail.add_(add[h:])
    thr = _sample_of_sum(flat, add, k * margin / n, sample, gen)
    colmax, idx, val = _sweep(flat, head, thr, None if add is None else add[:h].view(nb, c, w))
    raise_unless(torch.isfinite(colmax.max()) & torch.isfinite(tail).all())
    if sum(i.numel() for i in idx) + tail.numel() < k:  # the columns' maxima reach k
        found = _above_sampled(colmax, k, sample, margin, gen)
        if found is None:  # unlucky samples: the k-th largest column maximum is safe
            thr = torch.topk(colmax.float(), k, sorted=False).values.min().to(colmax.dtype)
            found = thr, nonzero(colmax >= thr)
        i, v = _gather(flat, found[1], found[0], c, w)
        idx, val = [i], [v]
    # the candidates: exactly {i : |x_i| >= thr} and the tail, a superset of the top k
    if tail.numel():
        idx.append(torch.arange(h, n, device=flat.device))
        val.append(tail)
    val = torch.cat(val)
    return top_of_candidates(flat, torch.cat(idx), val.abs(), k, val)


def _above_np(
    xn: np.ndarray, an: np.ndarray | None, thr: float
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Indices and values of the elements of ``xn`` (``+= an`` first) with ``|x| >= thr``,
    and of any NaN (for the caller to refuse), piece by piece in the cache: two byte masks
    ``x < thr`` and ``x > -thr``, where a candidate is false, searched 8 bytes at a time
    (no compaction of a full-size mask: ``np.flatnonzero`` took a third of the sweep)."""
    n = xn.size
    h = n - n % 8
    w = max(64, min(h, NP_CHUNK_BYTES // xn.itemsize) // 64 * 64)
    hi, lo = xn.dtype.type(thr), xn.dtype.type(-thr)
    idx: list[np.ndarray] = []
    val: list[np.ndarray] = []
    if h:
        _sweep_np(xn[:h], None if an is None else an[:h], hi, lo, w, idx, val)
    if h < n:  # the last n % 8 elements: compared one by one
        t = xn[h:]
        if an is not None:
            np.add(t, an[h:], out=t)
        i = np.nonzero(np.less(t, hi) == np.less_equal(t, lo))[0]
        val.append(t[i])
        idx.append(i + h)
    return idx, val


_ONES = np.frombuffer(bytes([1] * 8), np.float64)[0]  # 8 true bytes, read as one float64


def _sweep_np(
    xn: np.ndarray,
    an: np.ndarray | None,
    hi: np.generic,
    lo: np.generic,
    w: int,
    idx: list[np.ndarray],
    val: list[np.ndarray],
) -> None:
    """:func:`_above_np`'s sweep over ``xn`` (a multiple of 8 elements) in pieces of ``w``."""
    like = torch.from_numpy(xn[:0]).bool()
    buf = _buffer("np_masks", 2 * w, like).numpy()
    flags = _buffer("np_flags", w // 4, like).numpy()
    flags2 = _buffer("np_flags2", w // 32, like).numpy()
    for j in range(0, xn.size, w):
        x = xn[j : j + w]
        s = x.size
        if an is not None:
            np.add(x, an[j : j + s], out=x)
        if s < w:  # the last piece: no masks left over from the one before
            buf[:] = True
        np.less(x, hi, out=buf[:s])
        np.greater(x, lo, out=buf[w : w + s])
        np.not_equal(buf.view(np.float64), _ONES, out=flags)
        q = np.flatnonzero(np.not_equal(flags.view(np.float64), 0.0, out=flags2))
        if q.size:
            i = _expand_words(buf, flags, q, w)
            val.append(x[i])
            i += j
            idx.append(i)


def _expand_words(buf: np.ndarray, flags: np.ndarray, q: np.ndarray, w: int) -> np.ndarray:
    """Positions of the false bytes of ``buf`` (two masks) in the flagged words ``q``."""
    e = np.flatnonzero(flags.view(np.uint64)[q].view(bool))
    q = q[e >> 3] * 8 + (e & 7)  # the flagged words of buf
    bits = buf.view(np.uint64)[q]
    bits ^= np.uint64(0x0101010101010101)  # candidates: true
    e = np.flatnonzero(bits.view(bool))
    q %= w // 8  # the word of the piece, in either mask
    return q[e >> 3] * 8 + (e & 7)


def tiled_dev(
    flat: Tensor,
    k: int,
    tiles: int,
    sample: int,
    margin: float,
    gen: Generator | None,
    kernel: str,
    add: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """``tiled`` on CUDA with one sync (the finiteness flag; none while deferred) and no
    data-dependent shape, ``flat += add`` first: the radix path (Triton, fused with the
    addition), else the top k column maxima of the ``(C, R)`` view and all their elements
    (``C < 2``: torch.topk)."""
    started: list[bool] = []
    found = triton_run("radix", kernel, flat, lambda t: t.radix_topk(flat, k, add, started))
    if found is not None:
        vals, idx, finite = found
        raise_unless(finite)
        return vals, idx
    if add is not None and not started:  # a radix launch that failed may have added it
        flat.add_(add.reshape(-1))
    c = rows_for(flat.numel(), k, tiles)
    if c < 2:
        return exact(flat, k)
    n = flat.numel()
    r = n // c
    head, tail = flat[: c * r].view(c, r), flat[c * r :]
    colmax = torch.maximum(torch.amax(head, 0), torch.amin(head, 0).neg_())
    colmax = colmax if colmax.dtype == torch.float64 else colmax.float()
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
