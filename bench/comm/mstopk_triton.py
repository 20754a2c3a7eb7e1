"""Triton kernel for MSTopK on CUDA: the ``|x|`` column maxima of the ``tiled`` view in one read.

``tiled`` views the flat tensor as a ``(C, R)`` matrix and needs, for every column ``j``,
``max_c |x[c * R + j]|``.  In torch that is two streaming reductions (``amax`` and ``amin``
over the rows) and an elementwise ``maximum``: two reads of ``x``.  :func:`colmax_abs` does
it in one: each program owns ``BLOCK`` consecutive columns, walks the ``C`` rows (coalesced
loads of ``BLOCK`` contiguous elements per row) and keeps a float32 running maximum.  A NaN
anywhere in a column makes that column's maximum NaN (tracked explicitly, whatever
``tl.maximum`` does with NaN), so the caller's finiteness check sees it.

Triton ships with torch's CUDA build.  This module imports it when it is itself imported
(only from the CUDA path of :func:`bench.comm.selection.mstopk`); :data:`AVAILABLE` is
False when it cannot be imported, and the caller falls back to torch.
"""

from __future__ import annotations

import torch

try:  # absent or broken on some machines; the caller falls back to the torch path
    import triton
    import triton.language as tl
except Exception:  # noqa: BLE001 - any import failure means "no triton"
    triton = None
    tl = None

AVAILABLE = triton is not None
BLOCK = 1024  # columns per program: 8 float32 per thread with 4 warps

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
    _colmax_kernel[grid](head, out, rows, cols, BLOCK=BLOCK, num_warps=4)
    return out
