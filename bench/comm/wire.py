"""What sparse values look like on the wire: the packet format and safe low-precision values.

Packet (``pack``/``unpack``): one uint8 buffer per worker and bucket holding the indices
first (int32 when the bucket has < 2**31 elements, else int64) and then the values
(float32, or float16/bfloat16 with ``value_dtype``), padded to a multiple of 8 bytes so
gathered packets stay aligned.  ``k`` is the same on every worker for a bucket, so the
packet size is known in advance and no header is exchanged.

Values (``to_wire``): a float16 wire value above 65504 would become inf (and the
error-feedback residual NaN); a bfloat16 one above ~3.39e38 likewise, and bfloat16 rounds
65504 up to 65536, past float16's range.  ``to_wire`` clamps to :func:`wire_limit`, the
largest value representable in the wire dtype that is also finite in the gradient's dtype,
before casting.  What the clamp and the rounding leave out stays in the residual: the
memory subtracts the wire values themselves (``ResidualMemory.update``), and keeps the
residual of float16/bfloat16 buckets in float32 (a float16 residual would overflow
where the clamp holds values back).  Receivers add
low-precision values into a float32 accumulator (:func:`accumulator`), so the sum of ``w``
workers' values cannot overflow either, and the mean (at most the limit) is finite in the
gradient's dtype.
"""

from __future__ import annotations

import functools

import torch

from bench.comm.cost import packet_bytes


def index_dtype(numel: int) -> torch.dtype:
    return torch.int32 if numel < 2**31 else torch.int64


def _size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def pack(values: torch.Tensor, indices: torch.Tensor, numel: int) -> torch.Tensor:
    """One uint8 buffer: indices (int32/int64), then ``values`` (already wire values)."""
    k = values.numel()
    idx = indices.to(index_dtype(numel))
    size = packet_bytes(k, numel, values.element_size())
    out = torch.zeros(size, dtype=torch.uint8, device=idx.device)
    ib = k * idx.element_size()
    out[:ib] = idx.view(torch.uint8)
    out[ib : ib + k * values.element_size()] = values.view(torch.uint8)
    return out


def unpack(
    buf: torch.Tensor, packets: int, k: int, numel: int, vdtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``packets`` gathered packets -> values and int64 indices, both ``(packets, k)``."""
    idt = index_dtype(numel)
    rows = buf.view(packets, -1)
    ib = k * _size(idt)
    vb = k * _size(vdtype)
    idx = rows[:, :ib].contiguous().view(idt).long()
    vals = rows[:, ib : ib + vb].contiguous().view(vdtype)
    return vals, idx


@functools.cache
def wire_limit(wire: torch.dtype, grad: torch.dtype) -> float:
    """Largest value of dtype ``wire`` that is finite in both ``wire`` and ``grad``."""
    lim = min(torch.finfo(wire).max, torch.finfo(grad).max)
    t = torch.tensor(lim, dtype=torch.float64).to(wire)
    while float(t) > lim:  # the cast rounded up (bfloat16(65504) == 65536)
        t = torch.nextafter(t, torch.zeros_like(t))
    return float(t)


def to_wire(
    values: torch.Tensor, wire: torch.dtype, bucket: torch.dtype | None = None
) -> torch.Tensor:
    """``values`` cast to ``wire``, clamped into ``wire_limit(wire, bucket)`` (never inf;
    ``bucket``: the dtype the receivers' mean lands in, default ``values.dtype``)."""
    lim = wire_limit(wire, bucket or values.dtype)
    if lim >= torch.finfo(values.dtype).max:  # nothing finite can overflow
        return values.to(wire)
    # clamp in float32, where the limit is exact (a bfloat16 clamp would round it up)
    return torch.clamp(values.float(), -lim, lim).to(wire)


def widened(dtype: torch.dtype) -> torch.dtype:
    """``dtype``, or float32 for the 16-bit float dtypes (sums and residuals)."""
    return dtype if torch.finfo(dtype).bits >= 32 else torch.float32


def accumulator(like: torch.Tensor, numel: int) -> torch.Tensor:
    """Zeroed sum buffer for received values: ``like``'s dtype, float32 below that."""
    return torch.zeros(numel, dtype=widened(like.dtype), device=like.device)
