"""Triton kernels for MSTopK on CUDA: ``tiled``'s radix path (:func:`radix_topk`) and
``paper``'s threshold search; without Triton (:data:`AVAILABLE`) the callers use torch.
"""

from __future__ import annotations

import contextlib
import functools
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
COUNT_BLOCK = 8192  # elements per program of a count: few atomics on the one counter

if AVAILABLE:

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


def guarded(name: str, forced: bool, call: Callable[[Any], Any], broken: dict[str, str]) -> Any:
    """``call(this module)``; on failure raise when ``forced``, else record ``broken[name]``,
    warn once and return None (the caller uses torch)."""
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
    """Make ``device`` current: Triton launches on the current CUDA device."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


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


# --- ``tiled``'s radix path: exact, no host sync, fixed shapes (docs/internals/comm.md) ---

GROUP_BYTES = 64  # a group: two 32-byte sectors (16 float32, 32 bfloat16)
TILE = 4096  # elements a program reads per iteration of the group pass
KEY_BLOCK = 4096  # keys a program reads per iteration of a radix pass
OUT_BLOCK = 1024  # candidates a program reads per iteration of the output pass
# the int64 workspace: a 256-bin histogram and a ticket per radix pass (passes 0-3 of the
# group maxima, 4-7 of the candidates), then the state; the selected indices follow it
TICKETS, G_STATE, C_STATE, G_TIES, C_TIES, C_COUNT, O_COUNT, FLAG = (
    2048, 2056, 2058, 2060, 2061, 2062, 2063, 2064,
)  # fmt: skip
WORKSPACE = 2080

if AVAILABLE:

    @triton.jit
    def _finish_pass(ws_ptr, hist, PASS, prefix, krem, active):
        # add this program's histogram; the last program to finish picks the digit of the
        # krem-th largest key still in play and writes (prefix << 8 | digit, krem left)
        b = tl.arange(0, 256)
        if active:
            tl.atomic_add(ws_ptr + PASS * 256 + b, hist.to(tl.int64))
        # every thread's additions before the one thread's ticket (whose release then
        # covers them: CUB's __syncthreads + __threadfence before its last-block count)
        tl.debug_barrier()
        if tl.atomic_add(ws_ptr + 2048 + PASS, 1) == tl.num_programs(0) - 1:
            h = tl.load(ws_ptr + PASS * 256 + b, volatile=True)
            s = tl.sum(h, 0) - tl.cumsum(h, 0) + h  # keys in play with this digit or above
            d = tl.maximum(tl.sum((s >= krem).to(tl.int64), 0) - 1, 0)
            above = tl.sum(tl.where(b == d, s - h, 0), 0)
            st = ws_ptr + 2056 + 2 * (PASS // 4)
            tl.store(st, prefix * 256 + d)
            tl.store(st + 1, krem - above)

    @triton.jit
    def _take(key, t, krem, ties_ptr):
        # every key above t, and the first krem (over all programs) of those equal to it
        eq = key == t
        ne = tl.sum(eq.to(tl.int64), 0)
        base = ne * 0
        if ne > 0:
            base = tl.atomic_add(ties_ptr, ne)
        rank = base + tl.cumsum(eq.to(tl.int64), 0) - 1
        return (key > t) | (eq & (rank < krem))

    # sizes are not specialised (divisible by 16, equal to 1): one compile per dtype and
    # group size serves every bucket; the loads' alignment comes from G, a constant
    @triton.jit(do_not_specialize=["n", "ngroups", "k"])
    def _group_kernel(
        x_ptr, add_ptr, key_ptr, ws_ptr, n, ngroups, k,
        HAS_ADD: tl.constexpr, G: tl.constexpr, GB: tl.constexpr,
    ):  # fmt: skip
        # one read of x (+= add first, written back): each group's max |x| as its float32
        # bits (monotone in it), the non-finite flag, the histogram of the keys' top digit
        rows = tl.arange(0, GB)
        hist = tl.zeros((256,), dtype=tl.int32)
        bad = tl.zeros((GB,), dtype=tl.int32)
        for g0 in range(tl.program_id(0) * GB, ngroups, tl.num_programs(0) * GB):
            grp = g0 + rows
            live = grp < ngroups
            offs = grp.to(tl.int64)[:, None] * G + tl.arange(0, G)[None, :]
            m = offs < n
            v = tl.load(x_ptr + offs, mask=m, other=0.0)
            if HAS_ADD:
                w = tl.load(add_ptr + offs, mask=m, other=0.0).to(tl.float32)
                v = (v.to(tl.float32) + w).to(x_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
                tl.store(x_ptr + offs, v, mask=m)
            a = tl.abs(v.to(tl.float32))
            nonfinite = m & ((a != a) | (a == float("inf")))
            bad = tl.maximum(bad, tl.max(nonfinite.to(tl.int32), axis=1))
            key = tl.max(a, axis=1).to(tl.int32, bitcast=True)
            tl.store(key_ptr + grp, key, mask=live)
            hist += tl.histogram(tl.where(live, key >> 24, 0), 256)
            hist -= tl.where(tl.arange(0, 256) == 0, GB - tl.sum(live.to(tl.int32), 0), 0)
        if tl.max(bad, 0) > 0:
            tl.store(ws_ptr + 2064, 1)
        _finish_pass(ws_ptr, hist, 0, 0, k, True)

    @triton.jit(do_not_specialize=["n", "PASS", "SHIFT"])  # one compile serves every pass
    def _pass_kernel(
        key_ptr, ws_ptr, n, PASS, SHIFT, COUNTED: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # the histogram of the next digit of the keys whose higher digits are the prefix
        # chosen so far; COUNTED: as many keys as the candidate count (else n); PASS and
        # SHIFT are arguments, not constants: one compiled kernel serves every pass
        st = ws_ptr + 2056 + 2 * (PASS // 4)
        prefix = tl.load(st)
        krem = tl.load(st + 1)
        if COUNTED:
            count = tl.load(ws_ptr + 2062)
        else:
            count = n
        hist = tl.zeros((256,), dtype=tl.int32)
        for s0 in range(tl.program_id(0) * BLOCK, count, tl.num_programs(0) * BLOCK):
            o = s0 + tl.arange(0, BLOCK)
            key = tl.load(key_ptr + o, mask=o < count, other=-1)
            play = (key >> (SHIFT + 8)) == prefix
            hist += tl.histogram(tl.where(play, (key >> SHIFT) & 255, 0), 256)
            hist -= tl.where(tl.arange(0, 256) == 0, BLOCK - tl.sum(play.to(tl.int32), 0), 0)
        _finish_pass(ws_ptr, hist, PASS, prefix, krem, tl.program_id(0) * BLOCK < count)

    @triton.jit(do_not_specialize=["n", "ngroups", "k", "cap"])
    def _take_kernel(
        key_ptr, x_ptr, ckey_ptr, cidx_ptr, ws_ptr, n, ngroups, k, cap,
        G: tl.constexpr, GB: tl.constexpr,
    ):  # fmt: skip
        # exactly k groups (the keys above the k-th largest, then enough equal to it); of
        # their elements every one at or above it is a candidate, appended with its index,
        # and counted in the histogram of the candidates' top digit (G == 1: the groups
        # are the elements, every one taken is selected)
        t = tl.load(ws_ptr + 2056)
        krem = tl.load(ws_ptr + 2057)
        rows = tl.arange(0, GB)
        hist = tl.zeros((256,), dtype=tl.int32)
        for g0 in range(tl.program_id(0) * GB, ngroups, tl.num_programs(0) * GB):
            grp = g0 + rows
            key = tl.load(key_ptr + grp, mask=grp < ngroups, other=-1)
            take = _take(key, t, krem, ws_ptr + 2060)
            if tl.sum(take.to(tl.int32), 0) > 0:
                if G == 1:
                    c, ckey, idx = take, key, grp
                else:
                    offs = grp[:, None] * G + tl.arange(0, G)[None, :]
                    m = take[:, None] & (offs < n)
                    v = tl.load(x_ptr + offs, mask=m, other=0.0)
                    ek = tl.abs(v.to(tl.float32)).to(tl.int32, bitcast=True)
                    c = tl.reshape(m & (ek >= t), (GB * G,))
                    ckey = tl.reshape(ek, (GB * G,))
                    idx = tl.reshape(offs, (GB * G,))
                nc = tl.sum(c.to(tl.int64), 0)
                slot = tl.atomic_add(ws_ptr + 2062, nc) + tl.cumsum(c.to(tl.int64), 0) - 1
                ok = c & (slot < cap)
                tl.store(ckey_ptr + slot, ckey, mask=ok)
                tl.store(cidx_ptr + slot, idx, mask=ok)
                if G > 1:
                    hist += tl.histogram(tl.where(c, ckey >> 24, 0), 256)
                    hist -= tl.where(tl.arange(0, 256) == 0, GB * G - nc.to(tl.int32), 0)
        if G > 1:
            _finish_pass(ws_ptr, hist, 4, 0, k, True)

    @triton.jit(do_not_specialize=["k"])
    def _out_kernel(
        ckey_ptr, cidx_ptr, x_ptr, ws_ptr, oidx_ptr, oval_ptr, fin_ptr, k,
        ALL: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        # the k selected: candidates above the k-th largest, then enough equal to it (ALL:
        # every candidate, there are k), their indices and values; the finiteness flag
        count = tl.load(ws_ptr + 2062)
        t = tl.load(ws_ptr + 2058)
        krem = tl.load(ws_ptr + 2059)
        for s0 in range(tl.program_id(0) * BLOCK, count, tl.num_programs(0) * BLOCK):
            o = s0 + tl.arange(0, BLOCK)
            live = o < count
            key = tl.load(ckey_ptr + o, mask=live, other=-1)
            if ALL:
                take = live
            else:
                take = _take(key, t, krem, ws_ptr + 2061)
            nt = tl.sum(take.to(tl.int64), 0)
            if nt > 0:
                slot = tl.atomic_add(ws_ptr + 2063, nt) + tl.cumsum(take.to(tl.int64), 0) - 1
                ok = take & (slot < k)
                idx = tl.load(cidx_ptr + o, mask=ok, other=0)
                tl.store(oidx_ptr + slot, idx.to(tl.int64), mask=ok)
                tl.store(oval_ptr + slot, tl.load(x_ptr + idx, mask=ok, other=0.0), mask=ok)
        if tl.program_id(0) == 0:
            tl.store(fin_ptr, (tl.load(ws_ptr + 2064) == 0).to(tl.uint8))


def group_size(n: int, k: int, itemsize: int) -> int:
    """Elements per group: :data:`GROUP_BYTES`, halved while k groups exceed n / 4."""
    g = GROUP_BYTES // itemsize
    while g > 1 and 4 * k * g > n:
        g //= 2
    return g


def _sms(device: torch.device) -> int:
    """Programs of a persistent kernel: 4 per SM on CUDA, 4 in all under the interpreter."""
    if device.type != "cuda":
        return 4
    return 4 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=16)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def radix_topk(
    flat: torch.Tensor, k: int, add: torch.Tensor | None = None, started: list | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(values, int64 indices, finite)`` of the ``k`` largest ``|flat|`` (``0 < k < n``),
    exact, in no fixed order; ``finite``: a 0-dim bool device tensor, False for NaN or
    Inf.  ``flat += add`` first, in the same read.  Nothing is read back (CUDA-graph safe);
    ``started`` gets True appended once ``flat`` may have been changed."""
    if not AVAILABLE:
        raise RuntimeError("triton is not importable")
    n = flat.numel()
    if not 0 < k < n or n > 2**31 - GROUP_BYTES or not flat.is_contiguous():
        raise ValueError(f"radix_topk needs 0 < k < n < 2**31 and a contiguous tensor ({k}, {n})")
    g = group_size(n, k, flat.element_size())
    ngroups = triton.cdiv(n, g)
    cap = k * g  # candidates: every element of the k groups, at most
    dev = flat.device
    buf = torch.zeros(WORKSPACE + k, dtype=torch.int64, device=dev)
    ws, idx = buf[:WORKSPACE], buf[WORKSPACE:]  # zeros: an index short of k stays in range
    keys = torch.empty(ngroups, dtype=torch.int32, device=dev)
    ckey = torch.empty(cap, dtype=torch.int32, device=dev)
    cidx = torch.empty(cap, dtype=torch.int32, device=dev)
    vals = flat.new_empty(k)
    fin = torch.empty(1, dtype=torch.uint8, device=dev)
    gb = TILE // g
    most = _sms(dev)
    grid = (max(1, min(triton.cdiv(ngroups, gb), most)),)
    with _on(dev):
        if started is not None:
            started.append(True)
        _group_kernel[grid](
            flat, flat if add is None else add, keys, ws, n, ngroups, k,
            HAS_ADD=add is not None, G=g, GB=gb, num_warps=8,
        )  # fmt: skip
        pgrid = (max(1, min(triton.cdiv(ngroups, KEY_BLOCK), most)),)
        for p, shift in ((1, 16), (2, 8), (3, 0)):
            _pass_kernel[pgrid](keys, ws, ngroups, p, shift, COUNTED=False, BLOCK=KEY_BLOCK,
                                num_warps=8)  # fmt: skip
        _take_kernel[grid](keys, flat, ckey, cidx, ws, n, ngroups, k, cap, G=g, GB=gb,
                           num_warps=8)  # fmt: skip
        if g > 1:
            cgrid = (max(1, min(triton.cdiv(cap, KEY_BLOCK), most)),)
            for p, shift in ((5, 16), (6, 8), (7, 0)):
                _pass_kernel[cgrid](ckey, ws, cap, p, shift, COUNTED=True, BLOCK=KEY_BLOCK,
                                    num_warps=8)  # fmt: skip
        ogrid = (max(1, min(triton.cdiv(cap, OUT_BLOCK), most)),)
        _out_kernel[ogrid](ckey, cidx, flat, ws, idx, vals, fin, k, ALL=g == 1,
                           BLOCK=OUT_BLOCK, num_warps=4)  # fmt: skip
    return vals, idx, fin.view(torch.bool)[0]
