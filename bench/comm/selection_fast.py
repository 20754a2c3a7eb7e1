"""``tiled`` on CUDA near the read floor: the threshold from a histogram, one compaction.

The ``(C, R)`` view of ``tiled`` (:mod:`bench.comm.selection_tiled`) again, with the two
multi-pass ``torch.topk`` calls over millions of elements (the column maxima, then the
``C * k`` gathered candidates) replaced by counting:

1. one read of ``x`` yields the column maxima of ``|x|`` and the histogram of their float32
   bit patterns ``>> 20`` (2048 logarithmic buckets, 8 per octave; the patterns of
   non-negative floats order as the floats do), summed in registers per program;
2. the highest bucket ``b1`` whose columns and those above hold at least ``k`` columns, and
   a fine histogram (``>> 12``: 256 sub-buckets of 0.03 %) of the columns in ``b1`` alone,
   give the threshold ``T``: the lowest value of the highest sub-bucket with at least ``k``
   column maxima at or above it;
3. one compaction appends every element ``|x| >= T`` of the columns whose maximum reaches
   ``T`` (slots taken by one atomic per program), into a buffer of ``cap`` slots;
4. one ``torch.topk`` over the ``cap`` slots (about ``1.5 k``) and the tail.

Exact: at least ``k`` columns reach ``T``, each holds an element ``>= T``, so the k-th
largest ``|x|`` is ``>= T`` and every element of the top k is a candidate.  The count of
candidates stays on the device.  With a sync allowed (:func:`mstopk` called directly) it is
read once with the finiteness flag, and a count over ``cap`` (columns holding several
candidates each) compacts again into a buffer of that size.  Inside a hook
(``selection_core.deferring``) nothing is read: a count over ``cap`` returns ``k`` of the
candidates (every one ``>= T``, not always the largest) and notes a false "exact" flag
(``selection_core.note_exact``).  Non-finite input: ``T`` becomes 0 (``k`` unique indices
still) and the flag goes where :func:`~bench.comm.selection_core.raise_unless` sends it.

The three kernels are Triton (:mod:`bench.comm.mstopk_triton`); :class:`TorchOps` are the
same three in torch ops, with no data-dependent shape either, so that the logic here runs
and is tested on any CPU (and the Triton kernels under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

from typing import Any

import torch

from bench.comm.selection_core import deferring, host, note_exact, raise_unless

SHIFT1 = 20  # coarse buckets: float32 bits >> 20 (sign dropped): 2048, 8 per octave
BINS1 = 1 << (31 - SHIFT1)
SHIFT2 = 12  # fine sub-buckets of one coarse bucket: the next 8 bits
FINE = 1 << (SHIFT1 - SHIFT2)
INF_BIN = 0x7F800000 >> SHIFT1  # float32 +Inf's bucket; NaN patterns lie above it


def capacity(n: int, k: int) -> int:
    """Candidate slots: about 1.5 k (the histogram leaves ~1.003 k candidates when columns
    rarely hold two), never more than ``n``."""
    return min(n, k + k // 2 + 4096)


class TorchOps:
    """The three kernels in torch ops (any device; full-size temporaries, tests only)."""

    @staticmethod
    def colmax_hist(head: torch.Tensor, bins: int, shift: int) -> tuple[torch.Tensor, ...]:
        m = torch.maximum(torch.amax(head, 0), torch.amin(head, 0).neg()).float()
        key = m.view(torch.int32).bitwise_and(0x7FFFFFFF).bitwise_right_shift(shift).long()
        return m, torch.bincount(key, minlength=bins)[:bins]

    @staticmethod
    def refine_hist(
        colmax: torch.Tensor, b1: torch.Tensor, shift1: int, shift2: int, fine: int
    ) -> torch.Tensor:
        bits = colmax.view(torch.int32).bitwise_and(0x7FFFFFFF)
        sel = (bits >> shift1) == b1
        sub = ((bits >> shift2) & (fine - 1)).long()
        return torch.zeros(fine, dtype=torch.long, device=colmax.device).index_add_(
            0, sub, sel.long()
        )

    @staticmethod
    def compact_ge(
        head: torch.Tensor, colmax: torch.Tensor, thr: torch.Tensor, cap: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = head.abs().float().reshape(-1)
        hot = (colmax >= thr).expand(head.shape[0], -1).reshape(-1)
        cand = hot & (a >= thr)
        slot = torch.cumsum(cand, 0) - 1
        dst = torch.where(cand & (slot < cap), slot, cap)  # the rest into a dump slot
        absb = torch.full((cap + 1,), -1.0, device=a.device).scatter_(0, dst, a)
        pos = torch.arange(a.numel(), device=a.device)
        idxb = torch.zeros(cap + 1, dtype=torch.long, device=a.device).scatter_(0, dst, pos)
        absb[cap], idxb[cap] = -1.0, 0
        return absb[:cap], idxb[:cap], cand.sum()


def threshold(
    colmax: torch.Tensor, hist: torch.Tensor, k: int, ops: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(T, finite)`` from the coarse histogram and the fine one of its bucket ``b1``:
    0-dim float32 and bool device tensors, no sync.  At least ``k`` column maxima are
    ``>= T``; ``T`` is 0 when a column maximum is NaN or Inf."""
    dev = hist.device
    tail = torch.cat([hist.flip(0).cumsum(0).flip(0), hist.new_zeros(1)])
    finite = tail[INF_BIN] == 0
    b1 = (tail[:-1] >= k).sum() - 1  # tail[0] = all columns >= k: b1 >= 0
    # index_select, not tail[b1 + 1]: indexing by a 0-dim integer tensor reads it (a sync)
    above = tail.index_select(0, (b1 + 1).reshape(1))[0]  # columns in buckets above b1
    fine = ops.refine_hist(colmax, b1, SHIFT1, SHIFT2, FINE)
    tail2 = fine.flip(0).cumsum(0).flip(0) + above  # tail2[0] = tail[b1] >= k
    f2 = (tail2 >= k).sum() - 1
    bits = (b1 << SHIFT1) | (f2 << SHIFT2)
    thr = bits.to(torch.int32).view(torch.float32)
    return torch.where(finite, thr, torch.zeros((), device=dev)), finite


def tiled_fast(flat: torch.Tensor, k: int, c: int, ops: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The top ``k`` of ``flat`` by magnitude through the ``(c, n // c)`` view (see the
    module docstring); ``ops``: :mod:`bench.comm.mstopk_triton` or :class:`TorchOps`.
    One host sync, or none inside :func:`~bench.comm.selection_core.deferred_finite`."""
    n = flat.numel()
    r = n // c
    head, tail = flat[: c * r].view(c, r), flat[c * r :]
    colmax, hist = ops.colmax_hist(head, BINS1, SHIFT1)
    thr, finite = threshold(colmax, hist, k, ops)
    if tail.numel():
        finite = finite & torch.isfinite(tail).all()
    cap = capacity(c * r, k)
    absb, idxb, count = ops.compact_ge(head, colmax, thr, cap)
    if deferring():
        note_exact(count <= cap)
        raise_unless(finite)  # deferred: no read
    else:
        got, ok = host(torch.stack([count, finite.long()]))
        if not ok:
            raise_unless(finite, deferrable=False)
        if got > cap:  # columns holding several candidates: all of them, exactly
            absb, idxb, _ = ops.compact_ge(head, colmax, thr, int(got))
    if tail.numel():
        absb = torch.cat([absb, tail.abs().float()])
        idxb = torch.cat([idxb, torch.arange(c * r, n, device=flat.device)])
    idx = idxb[torch.topk(absb, k, sorted=False).indices]
    return flat[idx], idx
