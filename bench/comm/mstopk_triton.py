"""Triton kernels for MSTopK on CUDA: ``tiled``'s column maxima and histogram threshold,
``paper``'s threshold search.

Imported only on the CUDA path (:func:`bench.comm.selection_core.triton_run`);
:data:`AVAILABLE` is False without Triton and the callers fall back to torch
(docs/internals/comm.md).
"""

from __future__ import annotations

import contextlib
import math
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

try:  # absent or broken on some machines; the caller falls back to the torch path
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - any import failure means "no triton"
    triton = None
    tl = None

AVAILABLE = triton is not None
BLOCK = 1024  # columns per program: 8 float32 per thread with 4 warps
COUNT_BLOCK = 8192  # elements per program of a count: few atomics on the one counter

if AVAILABLE:

    @triton.jit
    def _colmax_kernel(x_ptr, out_ptr, rows, cols, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inb = offs < cols
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        bad = tl.zeros((BLOCK,), dtype=tl.int32)
        ptr = x_ptr + offs
        for _ in range(rows):
            v = tl.load(ptr, mask=inb, other=0.0).to(tl.float32)
            bad = bad | (v != v).to(tl.int32)
            acc = tl.maximum(acc, tl.abs(v))
            ptr += cols
        acc = tl.where(bad != 0, float("nan"), acc)
        tl.store(out_ptr + offs, acc, mask=inb)

    @triton.jit
    def _count_ge_kernel(x_ptr, f_ptr, i_ptr, n, BLOCK: tl.constexpr):
        # i[3] += #(|x| >= thr), thr = f[6] rounded to float32 as torch compares it
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inb = offs < n
        thr = tl.load(f_ptr + 6).to(tl.float32)
        v = tl.abs(tl.load(x_ptr + offs, mask=inb, other=0.0).to(tl.float32))
        tl.atomic_add(i_ptr + 3, tl.sum(((v >= thr) & inb).to(tl.int64), axis=0))

    @triton.jit
    def _paper_step_kernel(f_ptr, i_ptr, k):
        # f = [lo, hi, base, u, thres1, thres2, thr], i = [k1, k2, done, count]: one step
        # of the search with the count of thr, then the next thr; the torch loop's updates
        lo, hi, base, u = tl.load(f_ptr), tl.load(f_ptr + 1), tl.load(f_ptr + 2), tl.load(f_ptr + 3)
        t1, t2, thr = tl.load(f_ptr + 4), tl.load(f_ptr + 5), tl.load(f_ptr + 6)
        k1, k2, done, nnz = (
            tl.load(i_ptr),
            tl.load(i_ptr + 1),
            tl.load(i_ptr + 2),
            tl.load(i_ptr + 3),
        )
        ratio = (lo + hi) / 2  # the ratio thr came from
        le = (nnz <= k) & (done == 0)
        gt = (nnz > k) & (done == 0)
        hi = tl.where(le, ratio, hi)
        lo = tl.where(gt, ratio, lo)
        up1 = le & ((nnz > k1) | (t1 == float("inf")))
        k1 = tl.where(up1, nnz, k1)
        t1 = tl.where(up1, thr, t1)
        up2 = gt & (nnz < k2)
        k2 = tl.where(up2, nnz, k2)
        t2 = tl.where(up2, thr, t2)
        done = tl.where(nnz == k, 1, done)
        ratio = (lo + hi) / 2
        thr = base + ratio * (u - base)
        tl.store(f_ptr, lo)
        tl.store(f_ptr + 1, hi)
        tl.store(f_ptr + 4, t1)
        tl.store(f_ptr + 5, t2)
        tl.store(f_ptr + 6, thr)
        tl.store(i_ptr, k1)
        tl.store(i_ptr + 1, k2)
        tl.store(i_ptr + 2, done)
        tl.store(i_ptr + 3, 0)

    @triton.jit
    def _colmax_hist_kernel(
        x_ptr,
        out_ptr,
        hist_ptr,
        rows,
        cols,
        BLOCK: tl.constexpr,
        BINS: tl.constexpr,
        SHIFT: tl.constexpr,
    ):
        # persistent: program p owns column blocks p, p + P, ...; per block the column
        # maxima of |x| (NaN kept, as _colmax_kernel) and their histogram over float32 bit
        # patterns >> SHIFT, summed in registers, added to hist once per program
        pid = tl.program_id(0)
        nblocks = tl.cdiv(cols, BLOCK)
        counts = tl.zeros((BINS,), dtype=tl.int32)
        for blk in range(pid, nblocks, tl.num_programs(0)):
            offs = blk * BLOCK + tl.arange(0, BLOCK).to(tl.int64)  # blk: int in the interpreter
            inb = offs < cols
            acc = tl.zeros((BLOCK,), dtype=tl.float32)
            bad = tl.zeros((BLOCK,), dtype=tl.int32)
            ptr = x_ptr + offs
            for _ in range(rows):
                v = tl.load(ptr, mask=inb, other=0.0).to(tl.float32)
                bad = bad | (v != v).to(tl.int32)
                acc = tl.maximum(acc, tl.abs(v))
                ptr += cols
            acc = tl.where(bad != 0, float("nan"), acc)
            tl.store(out_ptr + offs, acc, mask=inb)
            key = (acc.to(tl.int32, bitcast=True) & 0x7FFFFFFF) >> SHIFT
            # lanes past the end count in bin 0; the caller subtracts them
            counts += tl.histogram(tl.where(inb, key, 0), BINS)
        tl.atomic_add(hist_ptr + tl.arange(0, BINS), counts)

    @triton.jit
    def _refine_kernel(
        colmax_ptr,
        b1_ptr,
        fine_ptr,
        cols,
        BLOCK: tl.constexpr,
        SHIFT1: tl.constexpr,
        SHIFT2: tl.constexpr,
        FINE: tl.constexpr,
    ):
        # fine[(bits >> SHIFT2) % FINE] += 1 for the columns in coarse bucket b1 only
        # (about k of them): one atomic each, spread over FINE counters
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inb = offs < cols
        bits = tl.load(colmax_ptr + offs, mask=inb, other=0.0).to(tl.int32, bitcast=True)
        bits = bits & 0x7FFFFFFF
        b1 = tl.load(b1_ptr).to(tl.int32)
        sel = inb & ((bits >> SHIFT1) == b1)
        ones = tl.full((BLOCK,), 1, dtype=tl.int32)
        tl.atomic_add(fine_ptr + ((bits >> SHIFT2) & (FINE - 1)), ones, mask=sel)

    @triton.jit
    def _compact_kernel(
        x_ptr,
        colmax_ptr,
        thr_ptr,
        abs_ptr,
        idx_ptr,
        count_ptr,
        rows,
        cols,
        cap,
        BLOCK: tl.constexpr,
        ROWS: tl.constexpr,
    ):
        # every |x| >= thr of the columns whose maximum reaches it, appended at slots taken
        # with one atomic per program that has any (their order: unspecified)
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inb = offs < cols
        thr = tl.load(thr_ptr)
        hot = inb & (tl.load(colmax_ptr + offs, mask=inb, other=0.0) >= thr)
        r = tl.arange(0, ROWS)
        pos = r[:, None].to(tl.int64) * cols + offs[None, :]
        live = hot[None, :] & (r[:, None] < rows)
        v = tl.abs(tl.load(x_ptr + pos, mask=live, other=0.0).to(tl.float32))
        cand = tl.reshape((live & (v >= thr)).to(tl.int32), (ROWS * BLOCK,))
        n = tl.sum(cand, axis=0)
        if n > 0:
            base = tl.atomic_add(count_ptr, n.to(tl.int64))
            slot = base + tl.cumsum(cand, 0).to(tl.int64) - 1
            ok = (cand != 0) & (slot < cap)
            tl.store(abs_ptr + slot, tl.reshape(v, (ROWS * BLOCK,)), mask=ok)
            tl.store(idx_ptr + slot, tl.reshape(pos, (ROWS * BLOCK,)), mask=ok)


def guarded(name: str, forced: bool, call: Callable[[Any], Any], broken: dict[str, str]) -> Any:
    """``call(this module)``; on failure (import, compile, launch) raise when ``forced``, else
    record ``broken[name]``, warn once and return None (the caller uses torch)."""
    try:
        if not AVAILABLE:
            raise RuntimeError("triton is not importable")
        return call(sys.modules[__name__])
    except Exception as e:  # noqa: BLE001 - any failure means "use torch"
        if getattr(e, "select_refusal", False):  # the input's fault (NaN/Inf), not Triton's
            raise
        if forced:
            raise RuntimeError(f"mstopk kernel='triton' failed: {e}") from e
        broken[name] = repr(e)
        warnings.warn(f"mstopk: Triton {name} kernel unusable, using torch ({e!r})", stacklevel=5)
        return None


def _on(device: torch.device) -> contextlib.AbstractContextManager:
    """Make ``device`` current: Triton launches on the current CUDA device (a CPU tensor only
    runs under Triton's interpreter, in tests)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def colmax_abs(head: torch.Tensor) -> torch.Tensor:
    """``max_c |head[c, j]|`` for each column ``j`` of a contiguous ``(C, R)`` tensor, float32.

    Raises whatever Triton raises when it cannot compile or launch (the caller falls back).
    """
    if not AVAILABLE:
        raise RuntimeError("triton is not importable")
    if head.dim() != 2 or not head.is_contiguous():
        raise ValueError("colmax_abs needs a contiguous 2-D tensor")
    rows, cols = head.shape
    out = torch.empty(cols, dtype=torch.float32, device=head.device)
    grid = (triton.cdiv(cols, BLOCK),)
    with _on(head.device):
        _colmax_kernel[grid](head, out, rows, cols, BLOCK=BLOCK, num_warps=4)
    return out


def paper_search(
    a: torch.Tensor, hi: torch.Tensor, k: int, iters: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``paper``'s threshold search over ``a = |x|`` (contiguous float32)."""
    if not AVAILABLE:
        raise RuntimeError("triton is not importable")
    if a.dtype != torch.float32 or not a.is_contiguous():
        raise ValueError("paper_search needs a contiguous float32 tensor")
    n = a.numel()
    grid = (triton.cdiv(n, COUNT_BLOCK),)
    opts = {"BLOCK": COUNT_BLOCK, "num_warps": 8}
    u, m = hi.double(), a.mean().double()
    z = torch.zeros_like(m)
    f = torch.stack([z, z + 1, m, u, z + math.inf, m, m])  # thr = the mean first
    i = torch.zeros(4, dtype=torch.long, device=a.device)
    with _on(a.device):
        _count_ge_kernel[grid](a, f, i, n, **opts)
    base = torch.where(i[3] > k, m, z)  # k above the mean: search [0, max] instead
    f[2], f[5], f[6] = base, base, base + (f[0] + f[1]) / 2 * (u - base)
    i.zero_()
    i[1].fill_(n)
    with _on(a.device):
        for _ in range(iters):
            _count_ge_kernel[grid](a, f, i, n, **opts)
            _paper_step_kernel[(1,)](f, i, k, num_warps=1, enable_fp_fusion=False)
    return f[4], f[5]


HIST_BLOCK = 1024  # columns per block of the column-max + histogram kernel
COMPACT_BLOCK = 128  # columns per program of the compaction (times up to 16 rows)


def _programs(device: torch.device, blocks: int) -> int:
    """Programs of the persistent kernel: 4 per SM keep the reads in flight (one per block
    on the CPU interpreter), and each adds its histogram once."""
    if device.type != "cuda":
        return max(1, min(blocks, 4))
    return max(1, min(blocks, 4 * torch.cuda.get_device_properties(device).multi_processor_count))


def colmax_hist(head: torch.Tensor, bins: int, shift: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Column maxima of ``|head|`` (contiguous ``(C, R)``; float32) and the int64 histogram
    of their float32 bit patterns ``>> shift`` in ``bins`` bins, from one read of ``head``."""
    if not AVAILABLE:
        raise RuntimeError("triton is not importable")
    rows, cols = head.shape
    out = torch.empty(cols, dtype=torch.float32, device=head.device)
    hist = torch.zeros(bins, dtype=torch.int32, device=head.device)
    blocks = triton.cdiv(cols, HIST_BLOCK)
    grid = (_programs(head.device, blocks),)
    with _on(head.device):
        _colmax_hist_kernel[grid](
            head, out, hist, rows, cols, BLOCK=HIST_BLOCK, BINS=bins, SHIFT=shift, num_warps=8
        )
    hist = hist.long()
    hist[0] -= blocks * HIST_BLOCK - cols  # the padding lanes of the last block
    return out, hist


def refine_hist(
    colmax: torch.Tensor, b1: torch.Tensor, shift1: int, shift2: int, fine: int
) -> torch.Tensor:
    """int64 counts of ``(bits >> shift2) % fine`` over the columns in coarse bucket ``b1``
    (a 0-dim device integer)."""
    if not AVAILABLE:
        raise RuntimeError("triton is not importable")
    out = torch.zeros(fine, dtype=torch.int32, device=colmax.device)
    cols = colmax.numel()
    b1 = b1.to(torch.int32).reshape(1)
    with _on(colmax.device):
        _refine_kernel[(triton.cdiv(cols, BLOCK),)](
            colmax,
            b1,
            out,
            cols,
            BLOCK=BLOCK,
            SHIFT1=shift1,
            SHIFT2=shift2,
            FINE=fine,
            num_warps=4,
        )
    return out.long()


def compact_ge(
    head: torch.Tensor, colmax: torch.Tensor, thr: torch.Tensor, cap: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(abs, idx, count)``: the float32 magnitudes and flat int64 indices of every element
    ``|x| >= thr`` (a 0-dim float32 device tensor) of the columns whose maximum reaches it,
    in the first ``count`` of ``cap`` slots (unused slots: magnitude -1, index 0).  ``count``
    (0-dim int64, on the device) may exceed ``cap``: those past it were dropped."""
    if not AVAILABLE:
        raise RuntimeError("triton is not importable")
    rows, cols = head.shape
    absb = torch.full((cap,), -1.0, dtype=torch.float32, device=head.device)
    idxb = torch.zeros(cap, dtype=torch.int64, device=head.device)
    count = torch.zeros(1, dtype=torch.int64, device=head.device)
    rows_p2 = triton.next_power_of_2(rows)
    with _on(head.device):
        _compact_kernel[(triton.cdiv(cols, COMPACT_BLOCK),)](
            head,
            colmax,
            thr.reshape(1),
            absb,
            idxb,
            count,
            rows,
            cols,
            cap,
            BLOCK=COMPACT_BLOCK,
            ROWS=rows_p2,
            num_warps=4,
        )
    return absb, idxb, count[0]
