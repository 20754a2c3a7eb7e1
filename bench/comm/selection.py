"""Top-k selection by magnitude: ``torch.topk``, MSTopK (Shi et al., MLSys 2021: a
threshold found by counting, not sorting) and its variants, random-k.  Every selector
``f(x, k, **options)`` returns ``min(k, numel)`` unique int64 indices into ``x.flatten()``
and their values, for any float dtype; NaN or Inf in ``x`` raise ValueError.
"""

from __future__ import annotations

import math
import os

import torch

from bench.comm import selection_tiled
from bench.comm.config import MSTopKMethod, parse
from bench.comm.selection_core import (  # noqa: F401 - host_syncs, _TRITON_BROKEN: public here
    _TRITON_BROKEN,
    checked,
    exact,
    host,
    host_syncs,
    nonfinite_error,
    nonzero,
    raise_unless,
    top_of_candidates,
    triton_run,
    trivial,
)
from bench.registry import ConfigError

MSTOPK_METHODS = tuple(MSTopKMethod.values())
SMALL_NUMEL = 1 << 15  # below this a sort is as fast as anything and exact


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by magnitude through ``torch.topk`` (the baseline)."""
    flat, k = checked(x, k)
    return trivial(flat, k) or exact(flat, k)


def randomk(
    x: torch.Tensor, k: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` indices drawn uniformly without replacement (magnitude-blind control)."""
    flat, k = checked(x, k)
    t = trivial(flat, k)
    if t is not None:
        return t
    idx = torch.randperm(flat.numel(), device=flat.device, generator=generator)[:k]
    vals = flat[idx]
    raise_unless(torch.isfinite(vals).all())
    return vals, idx


def _paper(flat: torch.Tensor, k: int, iters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MSTopK as published: ``iters`` counting passes, all above thres1, then the band."""
    a = flat.abs().float()
    hi = a.amax()
    if not math.isfinite(host(hi)):
        raise nonfinite_error()
    thres1, thres2 = host(torch.stack(_paper_search(a, hi, k, iters)))
    sure = nonzero(a >= thres1)[:k]  # thres1: the largest count <= k
    rest = k - sure.numel()
    if rest > 0:
        band = nonzero((a >= thres2) & (a < thres1))[:rest]
        if band.numel() < rest:  # degenerate thresholds (e.g. all equal): anything unused
            used = torch.zeros_like(a, dtype=torch.bool)
            used[sure] = True
            used[band] = True
            band = torch.cat([band, nonzero(~used)[: rest - band.numel()]])
        sure = torch.cat([sure, band])
    return flat[sure], sure


def _paper_search(
    a: torch.Tensor, hi: torch.Tensor, k: int, iters: int
) -> tuple[torch.Tensor, ...]:
    """``paper``'s search on 0-dim tensors, every iteration run (frozen once a count hits
    k): ``(thres1, thres2)``, the largest count <= k and the smallest > k."""
    u, m = hi.double(), a.mean().double()
    mask = torch.empty_like(a, dtype=torch.bool)

    def count(thr: torch.Tensor) -> torch.Tensor:
        torch.ge(a, thr, out=mask)
        return torch.count_nonzero(mask)

    base = torch.where(count(m) > k, m, torch.zeros_like(m))
    lo, hi_r = torch.zeros_like(m), torch.ones_like(m)
    k1, thres1 = torch.zeros_like(m, dtype=torch.long), torch.full_like(m, math.inf)
    k2, thres2 = torch.full_like(k1, a.numel()), base
    done = torch.zeros_like(m, dtype=torch.bool)
    for _ in range(iters):
        ratio = (lo + hi_r) / 2
        thr = base + ratio * (u - base)
        nnz = count(thr)
        le, gt = (nnz <= k) & ~done, (nnz > k) & ~done
        hi_r, lo = torch.where(le, ratio, hi_r), torch.where(gt, ratio, lo)
        up1 = le & ((nnz > k1) | torch.isinf(thres1))
        k1, thres1 = torch.where(up1, nnz, k1), torch.where(up1, thr, thres1)
        up2 = gt & (nnz < k2)
        k2, thres2 = torch.where(up2, nnz, k2), torch.where(up2, thr, thres2)
        done = done | (nnz == k)
    return thres1, thres2


def _paper_dev(
    flat: torch.Tensor, k: int, iters: int, kernel: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``paper`` with one sync: the search (Triton or torch), one compaction of
    ``a >= thres2``, a top-k ranking ``a >= thres1`` first, then the band in index order."""
    a = flat.abs().float()
    hi = a.amax()
    finite = torch.isfinite(hi)
    found = triton_run("paper", kernel, a, lambda t: t.paper_search(a, hi, k, iters))
    thres1, thres2 = found if found is not None else _paper_search(a, hi, k, iters)
    cand = nonzero(a >= torch.where(finite, thres2, math.nan))
    if cand.numel() < k:  # thres2 always leaves > k when x is finite
        raise_unless(finite)
        return _paper(flat, k, iters)
    sure = a[cand] >= thres1
    band_rank = torch.cumsum(~sure, 0)  # 1, 2, ... along the band in index order
    key = torch.where(sure, cand.numel() + 1, cand.numel() - band_rank)
    idx = cand[torch.topk(key, k, sorted=False).indices]
    return flat[idx], idx


def mstopk(
    x: torch.Tensor,
    k: int,
    method: MSTopKMethod | str = MSTopKMethod.tiled,
    *,
    iters: int = 20,
    sample: int = 65536,
    margin: float = 1.25,
    tiles: int = 16,
    bins: int = 65536,
    small_numel: int = SMALL_NUMEL,
    generator: torch.Generator | None = None,
    kernel: str = "auto",
    _device_path: bool | None = None,
    _add: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k by magnitude through a threshold search (MSTopK); see the module docstring."""
    flat, k = checked(x, k)
    method = parse(MSTopKMethod, method, "mstopk method")
    if iters < 1 or sample < 1 or margin < 1.0 or tiles < 1:
        raise ConfigError("mstopk needs iters >= 1, sample >= 1, margin >= 1, tiles >= 1")
    if not (512 <= bins <= 1 << 24) or bins & (bins - 1):
        raise ConfigError(f"mstopk bins must be a power of two from 512 to 2**24, got {bins}")
    if kernel not in ("auto", "torch", "triton"):
        raise ConfigError(f"mstopk kernel must be auto, torch or triton, got {kernel!r}")
    if kernel == "triton" and not flat.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError("mstopk kernel='triton' needs a CUDA tensor")
    on_device = flat.is_cuda if _device_path is None else _device_path  # one sync per call
    tiled = method is MSTopKMethod.tiled
    if _add is not None and not (tiled and small_numel <= flat.numel() and 0 < k < flat.numel()):
        flat, _add = flat.add_(_add.reshape(-1)), None  # not fused into the selection
    t = trivial(flat, k)
    if t is not None:
        return t
    if flat.numel() < small_numel:
        return exact(flat, k)
    if tiled and on_device:
        return selection_tiled.tiled_dev(flat, k, tiles, sample, margin, generator, kernel, _add)
    if tiled:
        return selection_tiled.tiled(flat, k, tiles, sample, margin, generator, add=_add)
    if method is MSTopKMethod.sampled:
        run = selection_tiled.sampled_dev if on_device else selection_tiled.sampled
        return run(flat, k, sample, margin, generator)
    if method is MSTopKMethod.hist:
        return hist(flat, k, bins, on_device)
    return _paper_dev(flat, k, iters, kernel) if on_device else _paper(flat, k, iters)


def mstopk_ef(
    residual: torch.Tensor,
    grad: torch.Tensor,
    k: int,
    method: MSTopKMethod | str = MSTopKMethod.tiled,
    **options: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Error feedback around :func:`mstopk`, in place."""
    if residual.shape != grad.shape or residual.dtype != grad.dtype:
        raise ConfigError("mstopk_ef needs a residual of the gradient's shape and dtype")
    if residual.device != grad.device or not residual.is_contiguous():
        raise ConfigError("mstopk_ef needs a contiguous residual on the gradient's device")
    vals, idx = mstopk(residual, k, method, _add=grad, **options)  # type: ignore[arg-type]
    residual.view(-1)[idx] = 0
    return vals, idx


#: the selectors by name (``Selector``; the compressors of the same names call them)
SELECTORS = {"topk": topk, "mstopk": mstopk, "randomk": randomk}


# --- ``hist``: every threshold counted in one pass over logarithmic buckets -------------

_INF_BITS = 0x7F800000  # float32 +Inf; NaN patterns lie above it


def _buckets(flat: torch.Tensor, shift: int) -> torch.Tensor:
    """int32 bucket of each ``|x_i|`` (monotone in it): float32 magnitude bits >> shift."""
    a = flat if flat.dtype == torch.float32 else flat.float()  # rounding is monotone
    return torch.bitwise_and(a.view(torch.int32), 0x7FFFFFFF).bitwise_right_shift_(shift)


def _finite64(flat: torch.Tensor) -> torch.Tensor:
    """float64 values beyond float32's range land in the Inf bucket: their own check."""
    if flat.dtype == torch.float64:
        return torch.isfinite(flat).all()
    return torch.ones((), dtype=torch.bool, device=flat.device)


def _tail(counts: torch.Tensor) -> torch.Tensor:
    """``tail[b]``: elements in buckets ``b`` and above (float64: exact to 2**53)."""
    return counts.double().flip(0).cumsum(0).flip(0)


def hist(
    flat: torch.Tensor, k: int, bins: int, on_device: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """The bucket ``b`` with ``tail[b] >= k`` elements, all above the rest; on a device with
    one sync: ``torch.histc`` of the integer keys (bincount's output size needs one more)
    and non-finite entries turn the threshold into "none"."""
    shift = 31 - (bins.bit_length() - 1)  # of the 31 magnitude bits: ``bins`` buckets
    nb = 1 << (31 - shift)
    key = _buckets(flat, shift)
    if on_device:
        tail = _tail(torch.histc(key.float(), bins=nb, min=0, max=nb))  # the keys are the bins
    else:
        tail = _tail(torch.bincount(key, minlength=nb))
    finite = (tail[_INF_BITS >> shift] == 0) & _finite64(flat)
    b = (tail >= k).sum() - 1
    if not on_device:
        ok, b = host(torch.stack([finite.long(), b]))
        if not ok:
            raise nonfinite_error()
        cand = nonzero(key >= int(b))
        return top_of_candidates(flat, cand, flat[cand].abs(), k)
    cand = nonzero(key >= torch.where(finite, b, nb))
    if cand.numel() >= k:
        return top_of_candidates(flat, cand, flat[cand].abs(), k)
    raise_unless(finite)
    return exact(flat, k)
