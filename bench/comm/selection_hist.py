"""MSTopK's ``hist`` method: every threshold counted in one pass, on logarithmic buckets.

The bucket of ``x_i`` is the float32 bit pattern of ``|x_i|`` (sign bit dropped) shifted
right: its exponent and top mantissa bits.  That integer is monotone in ``|x_i|`` and its
buckets are logarithmic (``bins = 65536``: 256 per octave, each 0.27 % wide), so a
heavy-tailed tensor (Cauchy, lognormal: a few values many octaves above the rest) spreads
over its buckets as well as a Gaussian one does, where linear bins over ``[0, max]`` would
put nearly everything into the lowest one.  The counts of all buckets (``torch.bincount``
on the CPU, ``torch.histc`` of the integer buckets on CUDA) give the highest bucket ``b``
with at least ``k`` elements at or above it; those elements are the candidates, an exact
top-k over them the answer.  Buckets at or above float32's Inf pattern count the NaN and Inf
entries: the finiteness check comes with the counts.
"""

from __future__ import annotations

import torch

from bench.comm.selection_core import (
    exact,
    host,
    nonfinite_error,
    nonzero,
    raise_unless,
    top_of_candidates,
)

_INF_BITS = 0x7F800000  # float32 +Inf; NaN patterns lie above it


def shift_for(bins: int) -> int:
    """Right shift of the 31 magnitude bits that leaves ``bins`` (a power of two) buckets."""
    return 31 - (bins.bit_length() - 1)


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


def hist(flat: torch.Tensor, k: int, bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    shift = shift_for(bins)
    key = _buckets(flat, shift)
    counts = torch.bincount(key, minlength=1 << (31 - shift))  # every key < 2**(31-shift)
    tail = _tail(counts)
    big = _INF_BITS >> shift
    bad = ((tail[big] > 0) | ~_finite64(flat)).long()
    bad, b = host(torch.stack([bad, (tail >= k).sum() - 1]))
    if bad:
        raise nonfinite_error()
    cand = nonzero(key >= int(b))  # tail[b] >= k elements, every one above the rest
    return top_of_candidates(flat, cand, flat[cand].abs(), k)


def hist_dev(flat: torch.Tensor, k: int, bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``hist`` with one sync: ``torch.histc`` of the integer buckets (bincount's output
    size would need one more), non-finite entries turn the threshold into "none"."""
    shift = shift_for(bins)
    nb = 1 << (31 - shift)
    key = _buckets(flat, shift)
    tail = _tail(torch.histc(key.float(), bins=nb, min=0, max=nb))  # the keys are the bins
    finite = (tail[_INF_BITS >> shift] == 0) & _finite64(flat)
    b = (tail >= k).sum() - 1
    cand = nonzero(key >= torch.where(finite, b, nb))
    if cand.numel() >= k:
        return top_of_candidates(flat, cand, flat[cand].abs(), k)
    raise_unless(finite)
    return exact(flat, k)
