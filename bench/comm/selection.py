"""Top-k selection by magnitude: exact ``torch.topk``, MSTopK and its faster variants, random-k.

Every selector takes a tensor ``x`` and a count ``k`` and returns ``(values, indices)``:
exactly ``min(k, x.numel())`` unique int64 indices into ``x.flatten()`` and the signed values
``x.flatten()[indices]`` (in ``x``'s dtype, in no particular order).  They run on CPU and CUDA
tensors of any float dtype (float32, float64, float16, bfloat16).

MSTopK (Shi et al., "Towards Scalable Distributed Training of Deep Learning on Public
Cloud Clusters", MLSys 2021; pseudo-code in ``docs/algorithms.md``) avoids the sort inside
``torch.topk``: it finds a magnitude threshold with a few cheap counting passes.
``mstopk(x, k, method=...)`` offers four ways to find it:

``paper`` (as published, approximate within the last band): ``N`` thresholds
``mean + r (max - mean)`` of ``|x|`` binary-searched over the ratio ``r``, ``N`` passes.
``sampled`` (exact): the threshold from a strided random sample of ``|x|`` with a margin,
one compare pass for the candidates, an exact top-k over those.
``hist`` (exact): all thresholds counted in one pass (a histogram of ``|x|`` over
``[0, max]``), candidates above the highest edge whose tail holds ``k``.
``tiled`` (default, exact): ``x`` viewed as a ``(C, R)`` matrix; its column maxima of
``|x|`` say which ~k columns can hold the top k; only those are gathered.  ~2 passes.

On CUDA each method runs a variant with one host sync per call (the ``_dev`` functions,
``_device_path`` selects them anywhere; more only in rare fallbacks and for NaN/Inf;
:func:`host_syncs` counts them; see ``docs/algorithms.md``), with Triton kernels for
``tiled``'s column maxima and ``paper``'s search (:mod:`bench.comm.mstopk_triton`).

Ties are broken arbitrarily but the result always has exactly ``k`` unique indices.
``k == 0`` returns empty tensors, ``k >= numel`` every index; tensors under ``small_numel``
elements go straight to ``torch.topk``.  NaN or Inf in ``x`` raise ``ValueError``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch

from bench.comm.config import MSTopKMethod, parse
from bench.registry import ConfigError, Registry

MSTOPK_METHODS = tuple(MSTopKMethod.values())  # ("tiled", "sampled", "hist", "paper")

# Below this many elements a sort is as fast as anything else and always exact.
SMALL_NUMEL = 1 << 15

#: Selector functions ``f(x, k, **options) -> (values, indices)`` by name.
SELECTORS: Registry = Registry("selector")


def _check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        try:
            k = int(k)  # numpy / 0-dim tensor integers
        except (TypeError, ValueError):
            raise ConfigError(f"k must be an integer, got {k!r}") from None
    if k < 0:
        raise ConfigError(f"k must be >= 0, got {k}")
    return k


def _check_float(x: torch.Tensor) -> torch.Tensor:
    if not x.is_floating_point():
        raise ConfigError(f"top-k selection needs a floating-point tensor, got {x.dtype}")
    return x.reshape(-1)


def _nonfinite_error() -> ValueError:
    return ValueError("the tensor contains NaN or Inf; refusing to select from it")


_SYNCS = [0]  # device-to-host reads and data-dependent shapes so far (see host_syncs)


def host_syncs() -> int:
    """Host syncs asked for so far: device reads (``_host``) and data-dependent shapes
    (``_nonzero``).  The difference of two readings around a call is that call's count."""
    return _SYNCS[0]


def _host(t: torch.Tensor) -> object:
    """The value of a (small) tensor on the host: the one way this module reads a device."""
    _SYNCS[0] += 1
    return t.tolist()


def _nonzero(mask: torch.Tensor) -> torch.Tensor:
    """Indices of the True entries of a mask (1-D: a tensor; else a tuple per dimension).
    Its size is data-dependent: one sync."""
    _SYNCS[0] += 1
    return torch.nonzero(mask).squeeze(1) if mask.dim() == 1 else torch.nonzero(mask, as_tuple=True)


def _raise_unless(finite: torch.Tensor) -> None:
    if not _host(finite):
        raise _nonfinite_error()


def _require_finite(flat: torch.Tensor) -> None:
    _raise_unless(torch.isfinite(flat).all())


def _trivial(flat: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The cases every selector treats alike: k == 0, k >= numel, tiny tensors."""
    n = flat.numel()
    if k == 0:
        _require_finite(flat)
        return flat.new_empty(0), torch.empty(0, dtype=torch.long, device=flat.device)
    if k >= n:
        _require_finite(flat)
        return flat.clone(), torch.arange(n, device=flat.device)
    return None


def _exact(flat: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    # float32 magnitudes keep fp16/bf16 ties and comparisons identical across devices
    _require_finite(flat)
    idx = torch.topk(flat.abs().float(), k, sorted=False).indices
    return flat[idx], idx


@SELECTORS.register("topk")
def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k by magnitude through ``torch.topk`` (the baseline)."""
    flat = _check_float(x)
    k = _check_k(k)
    return _trivial(flat, k) or _exact(flat, k)


@SELECTORS.register("randomk")
def randomk(
    x: torch.Tensor, k: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` indices drawn uniformly without replacement (magnitude-blind control)."""
    flat = _check_float(x)
    k = _check_k(k)
    t = _trivial(flat, k)
    if t is not None:
        return t
    idx = torch.randperm(flat.numel(), device=flat.device, generator=generator)[:k]
    vals = flat[idx]
    _raise_unless(torch.isfinite(vals).all())
    return vals, idx


def _top_of_candidates(
    flat: torch.Tensor, cand_idx: torch.Tensor, cand_abs: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k among candidates that are known to contain the global top-k."""
    sel = torch.topk(cand_abs.float(), k, sorted=False).indices
    idx = cand_idx[sel]
    return flat[idx], idx


def _sample_threshold(
    a: torch.Tensor, q_frac: float, sample: int, gen: torch.Generator | None, z: float = 0.0
) -> torch.Tensor:
    """Magnitude above which a fraction ``q_frac`` of ``a`` (non-negative) lies, from a sample.

    A strided sample with a random offset: one cache line per stride, no index tensor.  The
    offset comes from a CPU generator (no device sync).  ``z > 0`` lowers the threshold by
    ``z`` standard deviations of the sample count, so that it rarely leaves fewer than the
    aimed-at number of elements above it.  Returns a 0-dim tensor on ``a``'s device.
    """
    n = a.numel()
    s = min(n, sample)
    step = max(1, n // s)
    off = int(torch.randint(0, step, (1,), generator=gen)) if step > 1 else 0
    samp = a[off::step][:s].float()
    q = max(1, math.ceil(q_frac * samp.numel()))
    q = min(samp.numel(), q + math.ceil(z * math.sqrt(q)))
    return torch.topk(samp, q, sorted=False).values.min().to(a.dtype)


def _sampled(
    flat: torch.Tensor, k: int, sample: int, margin: float, gen: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    n = flat.numel()
    a = flat.abs()
    _raise_unless(torch.isfinite(a.max()))
    for attempt in range(3):
        thr = _sample_threshold(a, k * margin * (4**attempt) / n, sample, gen)
        cand = _nonzero(a >= thr)
        if cand.numel() >= k:
            return _top_of_candidates(flat, cand, a[cand], k)
    return _exact(flat, k)


def _sampled_dev(
    flat: torch.Tensor, k: int, sample: int, margin: float, gen: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sampled`` with one sync: finiteness folded into the one data-dependent compaction."""
    n = flat.numel()
    a = flat.abs()
    finite = torch.isfinite(a.amax())
    thr = _sample_threshold(a, k * margin / n, sample, gen, z=3.0)
    # NaN threshold when x is not finite: nothing compares >= NaN, no candidates
    cand = _nonzero(a >= torch.where(finite, thr, float("nan")))
    if cand.numel() >= k:
        return _top_of_candidates(flat, cand, a[cand], k)
    _raise_unless(finite)  # rare: an unlucky sample (or x is not finite)
    return _exact(flat, k)


def _hist(flat: torch.Tensor, k: int, bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = flat.abs().float()
    hi = _host(a.max())
    if not math.isfinite(hi):
        raise _nonfinite_error()
    if hi == 0.0:
        return _exact(flat, k)
    counts = torch.histc(a, bins=bins, min=0.0, max=hi)
    # tail[i] = number of elements in bins i..bins-1 = count of a >= edge_i
    tail = counts.flip(0).cumsum(0).flip(0)
    b = int(_host((tail >= k).sum())) - 1  # tail is non-increasing and tail[0] = numel
    for lower in range(b, -1, -1):  # histc's edge rounding can misplace a few elements
        cand = _nonzero(a >= hi * lower / bins)
        if cand.numel() >= k:
            return _top_of_candidates(flat, cand, a[cand], k)
    return _exact(flat, k)


def _hist_dev(flat: torch.Tensor, k: int, bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``hist`` with one sync, on the integer bucket ``floor(a * bins / max)``: monotone in
    ``a``, so ``bucket >= b`` is an upper set of ``tail[b] >= k`` elements (no edge rounding)."""
    a = flat.abs().float()
    hi = a.amax()
    finite = torch.isfinite(hi)
    scale = torch.where(finite & (hi > 0), bins / hi, torch.zeros_like(hi))
    u = torch.mul(a, scale).floor_().clamp_(max=bins - 1)
    counts = torch.histc(u, bins=bins, min=0, max=bins).double()  # u's integers are bins
    tail = counts.flip(0).cumsum(0).flip(0)
    b = (tail >= k).sum() - 1
    cand = _nonzero(u >= torch.where(finite, b.float(), float("nan")))
    if cand.numel() >= k:
        return _top_of_candidates(flat, cand, a[cand], k)
    _raise_unless(finite)  # x not finite (or a subnormal max overflowed the scale)
    return _exact(flat, k)


def _paper(flat: torch.Tensor, k: int, iters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MSTopK as published: N counting passes, keep above thres1, fill from the band."""
    a = flat.abs().float()
    u, m = _host(torch.stack([a.max(), a.mean()]))
    if not math.isfinite(u):
        raise _nonfinite_error()
    mask = torch.empty_like(a, dtype=torch.bool)

    def count(thr: float) -> int:
        torch.ge(a, thr, out=mask)
        return _host(torch.count_nonzero(mask))

    base = m if count(m) > k else 0.0  # k above the mean: search [0, max] instead
    lo, hi_r = 0.0, 1.0
    k1, thres1 = 0, math.inf  # largest count <= k and its threshold
    k2, thres2 = a.numel(), base  # smallest count > k and its threshold
    for _ in range(iters):
        ratio = (lo + hi_r) / 2
        thr = base + ratio * (u - base)
        nnz = count(thr)
        if nnz <= k:
            hi_r = ratio
            if nnz > k1 or thres1 == math.inf:
                k1, thres1 = nnz, thr
        else:
            lo = ratio
            if nnz < k2:
                k2, thres2 = nnz, thr
        if nnz == k:
            break
    sure = _nonzero(a >= thres1) if k1 > 0 else a.new_empty(0, dtype=torch.long)
    sure = sure[:k]
    rest = k - sure.numel()
    if rest > 0:
        band = _nonzero((a >= thres2) & (a < thres1))[:rest]
        if band.numel() < rest:  # degenerate thresholds (e.g. all equal): anything unused
            used = torch.zeros_like(mask)
            used[sure] = True
            used[band] = True
            band = torch.cat([band, _nonzero(~used)[: rest - band.numel()]])
        sure = torch.cat([sure, band])
    return flat[sure], sure


def _paper_search(
    a: torch.Tensor, hi: torch.Tensor, k: int, iters: int
) -> tuple[torch.Tensor, ...]:
    """:func:`_paper`'s search on 0-dim device tensors, every iteration run (frozen once a
    count hits k): ``(thres1, thres2)``, the same as the CPU loop's."""
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
    ``a >= thres2``, a top-k over a key ranking ``a >= thres1`` first, then the band in
    index order."""
    a = flat.abs().float()
    hi = a.amax()
    finite = torch.isfinite(hi)
    found = _triton_run("paper", kernel, a, lambda t: t.paper_search(a, hi, k, iters))
    thres1, thres2 = found if found is not None else _paper_search(a, hi, k, iters)
    cand = _nonzero(a >= torch.where(finite, thres2, math.nan))
    if cand.numel() < k:  # thres2 always leaves > k when x is finite
        _raise_unless(finite)
        return _paper(flat, k, iters)
    sure = a[cand] >= thres1
    band_rank = torch.cumsum(~sure, 0)  # 1, 2, ... along the band in index order
    key = torch.where(sure, cand.numel() + 1, cand.numel() - band_rank)
    idx = cand[torch.topk(key, k, sorted=False).indices]
    return flat[idx], idx


_TRITON_BROKEN: dict[str, str] = {}  # kernel -> why it failed here (torch is used since)


def _triton_run(name: str, kernel: str, x: torch.Tensor, call: Callable[[Any], Any]) -> Any:
    """``call(mstopk_triton)`` when kernel ``name`` is to run on ``x``, else None: ``auto``
    on contiguous CUDA tensors while it works (else torch, with one warning); ``triton``
    always (raising on failure); ``torch`` never; float64 never (the kernels use float32)."""
    wanted = kernel == "triton" or (kernel == "auto" and x.is_cuda and x.is_contiguous())
    if not wanted or x.dtype == torch.float64 or (kernel == "auto" and name in _TRITON_BROKEN):
        return None
    from bench.comm import mstopk_triton  # imports triton: CUDA (or forced) only

    return mstopk_triton.guarded(name, kernel == "triton", call, _TRITON_BROKEN)


def _colmax(head: torch.Tensor, kernel: str) -> torch.Tensor:
    """Column max ``|x|`` of the ``(C, R)`` view (float32; float64 kept); NaN propagates."""
    out = _triton_run("colmax", kernel, head, lambda t: t.colmax_abs(head))
    if out is not None:
        return out
    m = torch.maximum(torch.amax(head, 0), torch.amin(head, 0).neg_())
    return m if m.dtype == torch.float64 else m.float()


def _tiled(
    flat: torch.Tensor, k: int, tiles: int, sample: int, margin: float, gen: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    n = flat.numel()
    # C rows: enough that a column rarely holds two of the top k (fewer gathered elements
    # per hit), few enough that the column maxima stay >> k.  At 0.1 % density C = 16.
    c = min(tiles, n // (8 * k))
    if c < 2:
        return _sampled(flat, k, sample, margin, gen)
    r = n // c
    head = flat[: c * r].view(c, r)
    tail = flat[c * r :]  # < C elements: always candidates
    # |x| column maxima from two streaming reductions; NaN propagates through both.
    colmax = torch.maximum(torch.amax(head, 0), torch.amin(head, 0).neg_())
    _raise_unless(torch.isfinite(colmax.max()) & torch.isfinite(tail).all())
    for attempt in range(3):
        thr = _sample_threshold(colmax, k * margin * (4**attempt) / r, sample, gen)
        cols = _nonzero(colmax >= thr)
        if cols.numel() >= k:
            break
    else:  # unlucky samples: the k-th largest column maximum is always safe
        thr = torch.topk(colmax.float(), k, sorted=False).values.min().to(flat.dtype)
        cols = _nonzero(colmax >= thr)
    # >= k columns hold an element >= thr, and every element >= thr is in one of them:
    # the candidates below are exactly {i : |x_i| >= thr}, a superset of the top k.
    g = head.index_select(1, cols).abs_()
    rows, pos = _nonzero(g >= thr)
    cand_idx = rows * r + cols[pos]
    cand_abs = g[rows, pos]
    if tail.numel():
        cand_idx = torch.cat([cand_idx, torch.arange(c * r, n, device=flat.device)])
        cand_abs = torch.cat([cand_abs, tail.abs()])
    return _top_of_candidates(flat, cand_idx, cand_abs, k)


def _tiled_dev(
    flat: torch.Tensor, k: int, tiles: int, sample: int, margin: float, gen, kernel: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``tiled`` with one sync (the finiteness flag) and no data-dependent shape.  Exact: of
    the k columns with the largest maxima, those above the k-th largest value v hold every
    element > v, and the rest (maximum v) enough elements equal to v."""
    n = flat.numel()
    c = min(tiles, n // (8 * k))  # as in _tiled
    if c < 2:
        return _sampled_dev(flat, k, sample, margin, gen)
    r = n // c
    head = flat[: c * r].view(c, r)
    tail = flat[c * r :]
    colmax = _colmax(head, kernel)
    finite = torch.isfinite(colmax.amax()) & torch.isfinite(tail).all()
    cols = torch.topk(colmax, k, sorted=False).indices
    cand_abs = head.index_select(1, cols).abs_().float().reshape(-1)
    cand_idx = (torch.arange(c, device=flat.device)[:, None] * r + cols).reshape(-1)
    if tail.numel():
        cand_idx = torch.cat([cand_idx, torch.arange(c * r, n, device=flat.device)])
        cand_abs = torch.cat([cand_abs, tail.abs().float()])
    out = _top_of_candidates(flat, cand_idx, cand_abs, k)
    _raise_unless(finite)
    return out


@SELECTORS.register("mstopk")
def mstopk(
    x: torch.Tensor,
    k: int,
    method: MSTopKMethod | str = MSTopKMethod.tiled,
    *,
    iters: int = 20,
    sample: int = 65536,
    margin: float = 1.25,
    tiles: int = 16,
    bins: int = 4096,
    small_numel: int = SMALL_NUMEL,
    generator: torch.Generator | None = None,
    kernel: str = "auto",
    _device_path: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Approximate-threshold top-k by magnitude (MSTopK); see the module docstring.

    Args: ``x`` any float tensor (CPU or CUDA), selection over ``x.flatten()``; ``k >= 0``
    elements (``k >= numel``: all); ``method`` ``tiled`` (default), ``sampled``, ``hist``
    (all exact) or ``paper`` (approximate within the last band); ``iters`` search steps of
    ``paper``; ``sample`` size and ``margin`` (> 1, aim at ``margin * k`` candidates) of the
    sampled thresholds; ``tiles`` rows ``C`` of ``tiled``; ``bins`` of ``hist``; below
    ``small_numel`` elements ``torch.topk``; ``generator`` a CPU RNG for sample offsets;
    ``kernel`` ``auto`` (Triton for ``tiled``'s column maxima on CUDA when it works),
    ``torch`` or ``triton`` (CUDA only; float64 always uses torch).

    Returns ``(values, indices)``: ``min(k, numel)`` values of ``x.flatten()`` and their
    unique int64 indices.  Raises ConfigError (``k < 0``, unknown method or kernel,
    non-float tensor) or ValueError (``x`` contains NaN or Inf).
    """
    flat = _check_float(x)
    k = _check_k(k)
    method = parse(MSTopKMethod, method, "mstopk method")
    if iters < 1 or sample < 1 or margin < 1.0 or tiles < 1 or bins < 2:
        raise ConfigError(
            "mstopk needs iters >= 1, sample >= 1, margin >= 1, tiles >= 1, bins >= 2"
        )
    if kernel not in ("auto", "torch", "triton"):
        raise ConfigError(f"mstopk kernel must be auto, torch or triton, got {kernel!r}")
    if kernel == "triton" and not flat.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError("mstopk kernel='triton' needs a CUDA tensor")
    t = _trivial(flat, k)
    if t is not None:
        return t
    if flat.numel() < small_numel:
        return _exact(flat, k)
    if flat.is_cuda if _device_path is None else _device_path:  # one sync per call
        if method is MSTopKMethod.tiled:
            return _tiled_dev(flat, k, tiles, sample, margin, generator, kernel)
        if method is MSTopKMethod.sampled:
            return _sampled_dev(flat, k, sample, margin, generator)
        if method is MSTopKMethod.hist:
            return _hist_dev(flat, k, bins)
        return _paper_dev(flat, k, iters, kernel)
    if method is MSTopKMethod.tiled:
        return _tiled(flat, k, tiles, sample, margin, generator)
    if method is MSTopKMethod.sampled:
        return _sampled(flat, k, sample, margin, generator)
    if method is MSTopKMethod.hist:
        return _hist(flat, k, bins)
    return _paper(flat, k, iters)


def select(
    name: str, x: torch.Tensor, k: int, **options: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the selector registered as ``name`` (``topk``, ``mstopk`` or ``randomk``)."""
    return SELECTORS.get(name)(x, k, **options)


def k_for(numel: int, density: float) -> int:
    """Elements to send for a tensor of ``numel`` at ``density`` (at least 1 when numel > 0)."""
    if not 0.0 < density <= 1.0:
        raise ConfigError(f"density must be in (0, 1], got {density}")
    return min(numel, max(1, math.ceil(density * numel))) if numel else 0
