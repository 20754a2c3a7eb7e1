"""Top-k selection by magnitude: exact ``torch.topk``, MSTopK and its faster variants, random-k.

Every selector takes a tensor ``x`` and a count ``k`` and returns ``(values, indices)``:
exactly ``min(k, x.numel())`` unique int64 indices into ``x.flatten()`` and the signed values
``x.flatten()[indices]`` (in ``x``'s dtype, in no particular order).  They run on CPU and CUDA
tensors of any float dtype (float32, float64, float16, bfloat16).

MSTopK (Shi et al., "Towards Scalable Distributed Training of Deep Learning on Public
Cloud Clusters", MLSys 2021; pseudo-code in ``docs/algorithms.md``) avoids the sort inside
``torch.topk``: it binary-searches a magnitude threshold with a few cheap counting passes.
``mstopk(x, k, method=...)`` offers four ways to find that threshold:

``paper``
    The algorithm as published: ``N`` ratios ``r`` in [0, 1] give thresholds
    ``mean + r (max - mean)`` of ``|x|``; each is counted over the whole tensor; the indices
    above the best threshold with at most ``k`` hits are kept and the rest are filled from the
    band between the two best thresholds (in index order, so it is approximate within the
    band).  ``N`` full passes: a GPU algorithm, slow on a CPU.
``sampled``
    The threshold search on a random (strided) sample of ``|x|`` with a safety margin, then
    one full compare pass collects the candidates and an exact top-k over those few picks
    the result.  Exact whenever the sample threshold leaves at least ``k`` candidates (it
    retries with a lower threshold, then falls back to ``torch.topk``).
``hist``
    All candidate thresholds counted in one pass (a histogram of ``|x|`` over ``[0, max]``),
    the threshold is the lowest edge whose tail holds ``k``; candidates and exact top-k as
    above.  Exact.
``tiled`` (default)
    Two-level selection, this project's CPU-friendly variant.  ``x`` is viewed as a
    ``(C, R)`` matrix and its column-wise max ``|x|`` is taken with two streaming
    reductions (``amax``, ``amin``), which are vectorised along the contiguous axis and
    write only ``R = numel / C`` values.  The threshold search runs on a sample of those
    column maxima; every element above the threshold lies in a column whose maximum is
    above it, so only those ~k columns (``C`` elements each) are gathered, compared and
    passed to an exact top-k.  With at least ``k`` such columns the result is the exact
    top-k; it costs about two read passes over ``x`` instead of a sort.

Ties are broken arbitrarily but the result always has exactly ``k`` unique indices (a
constant tensor returns ``k`` distinct positions).  ``k == 0`` returns empty tensors,
``k >= numel`` returns every index; tensors under ``small_numel`` elements go straight to
``torch.topk``.  NaN or Inf in ``x`` raise ``ValueError`` (the column maxima of ``tiled``
detect them for free; the other paths check explicitly).
"""

from __future__ import annotations

import math

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


def _require_finite(flat: torch.Tensor) -> None:
    if not bool(torch.isfinite(flat).all()):
        raise _nonfinite_error()


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
    # torch.topk on CPU lacks no float dtype any more, but float32 magnitudes keep
    # fp16/bf16 ties and comparisons identical across devices.
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
    if not bool(torch.isfinite(vals).all()):
        raise _nonfinite_error()
    return vals, idx


def _top_of_candidates(
    flat: torch.Tensor, cand_idx: torch.Tensor, cand_abs: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k among candidates that are known to contain the global top-k."""
    sel = torch.topk(cand_abs.float(), k, sorted=False).indices
    idx = cand_idx[sel]
    return flat[idx], idx


def _sample_threshold(
    a: torch.Tensor, q_frac: float, sample: int, gen: torch.Generator | None
) -> torch.Tensor:
    """Magnitude above which a fraction ``q_frac`` of ``a`` (non-negative) lies, from a sample.

    A strided sample with a random offset: one cache line per stride, no index tensor.
    """
    n = a.numel()
    s = min(n, sample)
    step = max(1, n // s)
    off = int(torch.randint(0, step, (1,), generator=gen).item()) if step > 1 else 0
    samp = a[off::step][:s].float()
    q = min(samp.numel(), max(1, math.ceil(q_frac * samp.numel())))
    return torch.topk(samp, q, sorted=False).values.min().to(a.dtype)


def _sampled(
    flat: torch.Tensor, k: int, sample: int, margin: float, gen: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    n = flat.numel()
    a = flat.abs()
    if not bool(torch.isfinite(a.max())):
        raise _nonfinite_error()
    for attempt in range(3):
        thr = _sample_threshold(a, k * margin * (4**attempt) / n, sample, gen)
        cand = torch.nonzero(a >= thr).squeeze(1)
        if cand.numel() >= k:
            return _top_of_candidates(flat, cand, a[cand], k)
    return _exact(flat, k)


def _hist(flat: torch.Tensor, k: int, bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = flat.abs().float()
    hi = a.max()
    if not bool(torch.isfinite(hi)):
        raise _nonfinite_error()
    if float(hi) == 0.0:
        return _exact(flat, k)
    counts = torch.histc(a, bins=bins, min=0.0, max=float(hi))
    # tail[i] = number of elements in bins i..bins-1 = count of a >= edge_i
    tail = counts.flip(0).cumsum(0).flip(0)
    b = int(torch.nonzero(tail >= k).max().item())
    for lower in range(b, -1, -1):  # histc's edge rounding can misplace a few elements
        thr = float(hi) * lower / bins
        cand = torch.nonzero(a >= thr).squeeze(1)
        if cand.numel() >= k:
            return _top_of_candidates(flat, cand, a[cand], k)
    return _exact(flat, k)


def _paper(flat: torch.Tensor, k: int, iters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """MSTopK as published: N counting passes, keep above thres1, fill from the band."""
    a = flat.abs().float()
    hi = a.max()
    if not bool(torch.isfinite(hi)):
        raise _nonfinite_error()
    u = float(hi)
    m = float(a.mean())
    mask = torch.empty_like(a, dtype=torch.bool)

    def count(thr: float) -> int:
        torch.ge(a, thr, out=mask)
        return int(torch.count_nonzero(mask))

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
    sure = torch.nonzero(a >= thres1).squeeze(1) if k1 > 0 else a.new_empty(0, dtype=torch.long)
    sure = sure[:k]
    rest = k - sure.numel()
    if rest > 0:
        band = torch.nonzero((a >= thres2) & (a < thres1)).squeeze(1)[:rest]
        if band.numel() < rest:  # degenerate thresholds (e.g. all equal): anything unused
            used = torch.zeros_like(mask)
            used[sure] = True
            used[band] = True
            band = torch.cat([band, torch.nonzero(~used).squeeze(1)[: rest - band.numel()]])
        sure = torch.cat([sure, band])
    return flat[sure], sure


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
    top = colmax.max()
    if not bool(torch.isfinite(top)) or (tail.numel() and not bool(torch.isfinite(tail).all())):
        raise _nonfinite_error()
    cols = None
    for attempt in range(3):
        thr = _sample_threshold(colmax, k * margin * (4**attempt) / r, sample, gen)
        cols = torch.nonzero(colmax >= thr).squeeze(1)
        if cols.numel() >= k:
            break
    else:  # unlucky samples: the k-th largest column maximum is always safe
        thr = torch.topk(colmax.float(), k, sorted=False).values.min().to(flat.dtype)
        cols = torch.nonzero(colmax >= thr).squeeze(1)
    # >= k columns hold an element >= thr, and every element >= thr is in one of them:
    # the candidates below are exactly {i : |x_i| >= thr}, a superset of the top k.
    g = head.index_select(1, cols).abs_()
    rows, pos = torch.nonzero(g >= thr, as_tuple=True)
    cand_idx = rows * r + cols[pos]
    cand_abs = g[rows, pos]
    if tail.numel():
        cand_idx = torch.cat([cand_idx, torch.arange(c * r, n, device=flat.device)])
        cand_abs = torch.cat([cand_abs, tail.abs()])
    return _top_of_candidates(flat, cand_idx, cand_abs, k)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Approximate-threshold top-k by magnitude (MSTopK); see the module docstring.

    Args:
        x: any float tensor (CPU or CUDA); selection is over ``x.flatten()``.
        k: number of elements to return (``0 <= k``; ``k >= numel`` returns all).
        method: ``tiled`` (default, exact), ``sampled`` (exact), ``hist`` (exact) or
            ``paper`` (as published: approximate within the last threshold band).
        iters: threshold-search iterations of ``paper`` (re-implementations use 20-100).
        sample: sample size (elements) for the threshold estimate of ``sampled``/``tiled``.
        margin: the sample threshold aims at ``margin * k`` candidates (safety, > 1).
        tiles: maximum number of rows ``C`` of the ``tiled`` view.
        bins: histogram bins of ``hist``.
        small_numel: tensors smaller than this use ``torch.topk`` directly.
        generator: RNG for the sample offsets (reproducible selections).
    Returns:
        ``(values, indices)``: ``min(k, numel)`` values of ``x.flatten()`` and their unique
        int64 indices.
    Raises:
        ConfigError: ``k < 0``, an unknown method or a non-float tensor.
        ValueError: ``x`` contains NaN or Inf.
    """
    flat = _check_float(x)
    k = _check_k(k)
    method = parse(MSTopKMethod, method, "mstopk method")
    if iters < 1 or sample < 1 or margin < 1.0 or tiles < 1 or bins < 2:
        raise ConfigError(
            "mstopk needs iters >= 1, sample >= 1, margin >= 1, tiles >= 1, bins >= 2"
        )
    t = _trivial(flat, k)
    if t is not None:
        return t
    if flat.numel() < small_numel:
        return _exact(flat, k)
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
