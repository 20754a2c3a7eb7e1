"""What every top-k selector shares: argument checks, host-sync counting, the exact
fallback, and the deferred finiteness flags (inside a DDP hook a selector hands its
"input finite" flag to a list instead of reading the device).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from bench.registry import ConfigError

_SYNCS = [0]  # device-to-host reads and data-dependent shapes so far (see host_syncs)
_TRITON_BROKEN: dict[str, str] = {}  # kernel -> why it failed here (torch is used since)
_DEFER = threading.local()  # .sink: where finiteness flags go instead of being read (deferred)


def checked(x: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    """``x`` flattened and ``k`` an int, or ConfigError."""
    if not x.is_floating_point():
        raise ConfigError(f"top-k selection needs a floating-point tensor, got {x.dtype}")
    if isinstance(k, bool) or not isinstance(k, int):
        try:
            k = int(k)  # numpy / 0-dim tensor integers
        except (TypeError, ValueError):
            raise ConfigError(f"k must be an integer, got {k!r}") from None
    if k < 0:
        raise ConfigError(f"k must be >= 0, got {k}")
    return x.reshape(-1), k


def nonfinite_error() -> ValueError:
    e = ValueError("the tensor contains NaN or Inf; refusing to select from it")
    e.select_refusal = True  # type: ignore[attr-defined]  # mstopk_triton.guarded re-raises it
    return e


def host_syncs() -> int:
    """Host syncs so far (device reads and data-dependent shapes): diff two readings."""
    return _SYNCS[0]


def host(t: torch.Tensor) -> object:
    """The value of a (small) tensor on the host: the one way the selectors read a device."""
    _SYNCS[0] += 1
    return t.tolist()


def nonzero(mask: torch.Tensor) -> torch.Tensor:
    """Indices of the True entries of a mask: one sync (a data-dependent size)."""
    _SYNCS[0] += 1
    return torch.nonzero(mask).squeeze(1) if mask.dim() == 1 else torch.nonzero(mask, as_tuple=True)


@contextlib.contextmanager
def deferred_finite(sink: list[torch.Tensor] | None) -> Iterator[None]:
    """Within the block (this thread), :func:`raise_unless` hands its flag to ``sink``."""
    prev = getattr(_DEFER, "sink", None)
    _DEFER.sink = sink
    try:
        yield
    finally:
        _DEFER.sink = prev


def raise_unless(finite: torch.Tensor, deferrable: bool = True) -> None:
    """Refuse a non-finite input: read the device flag ``finite`` (one sync), or, inside
    :func:`deferred_finite`, hand it to the sink unread.  ``deferrable=False`` for paths
    that would return fewer than ``k`` indices from a non-finite input."""
    sink = getattr(_DEFER, "sink", None)
    if sink is not None and deferrable:
        sink.append(finite.detach().reshape(()))
        return
    if not host(finite):
        raise nonfinite_error()


def require_finite(flat: torch.Tensor) -> None:
    raise_unless(torch.isfinite(flat).all())


def trivial(flat: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The cases every selector treats alike: k == 0, k >= numel."""
    n = flat.numel()
    if k == 0:
        require_finite(flat)
        return flat.new_empty(0), torch.empty(0, dtype=torch.long, device=flat.device)
    if k >= n:
        require_finite(flat)
        return flat.clone(), torch.arange(n, device=flat.device)
    return None


def exact(flat: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    # float32 magnitudes keep fp16/bf16 ties and comparisons identical across devices
    require_finite(flat)
    idx = torch.topk(flat.abs().float(), k, sorted=False).indices
    return flat[idx], idx


def top_of_candidates(
    flat: Tensor, cand_idx: Tensor, cand_abs: Tensor, k: int, cand_val: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Exact top-k among candidates known to hold the global top-k (float32 magnitudes: the
    same ties on every path); with few more than ``k`` (the usual case) the cheaper top-k
    of the ``m - k`` smallest, dropped.  ``cand_val``: their values, no gather from ``flat``."""
    m = cand_idx.numel()
    a = cand_abs.float()
    # on CUDA torch.topk costs about the same either way (14-20 launches a call)
    if m - k < k and not a.is_cuda:
        keep = torch.ones(m, dtype=torch.bool, device=a.device)
        keep[torch.topk(a, m - k, largest=False, sorted=False).indices] = False
    else:
        keep = torch.topk(a, k, sorted=False).indices
    if cand_val is not None:
        return cand_val[keep], cand_idx[keep]
    idx = cand_idx[keep]  # a boolean mask of known count: no sync on CUDA either
    return flat[idx], idx


def sample_threshold(
    a: torch.Tensor,
    q_frac: float,
    sample: int,
    gen: torch.Generator | None,
    z: float = 0.0,
    absolute: bool = False,
) -> torch.Tensor:
    """Magnitude above which a fraction ``q_frac`` of ``a`` lies, from a sample (``z``
    standard deviations to spare; ``absolute``: of ``|a|``)."""
    n = a.numel()
    s = min(n, sample)
    step = max(1, n // s)
    off = int(torch.randint(0, step, (1,), generator=gen)) if step > 1 else 0
    samp = a[off::step][:s]
    samp = samp.abs().float() if absolute else samp.float()
    q = max(1, math.ceil(q_frac * samp.numel()))
    q = min(samp.numel(), q + math.ceil(z * math.sqrt(q)))
    return torch.topk(samp, q, sorted=False).values.min().to(a.dtype)


def triton_run(name: str, kernel: str, x: torch.Tensor, call: Callable[[Any], Any]) -> Any:
    """``call(mstopk_triton)`` when kernel ``name`` is to run on ``x``, else None: ``auto``
    on contiguous CUDA tensors while it works, ``triton`` always (raising on failure),
    ``torch`` or float64 never."""
    wanted = kernel == "triton" or (kernel == "auto" and x.is_cuda and x.is_contiguous())
    if not wanted or x.dtype == torch.float64 or (kernel == "auto" and name in _TRITON_BROKEN):
        return None
    from bench.comm import mstopk_triton  # imports triton: CUDA (or forced) only

    return mstopk_triton.guarded(name, kernel == "triton", call, _TRITON_BROKEN)
