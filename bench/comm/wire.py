"""Sparse values on the wire: a packet is ``k`` indices (int32, int64 past 2**31 elements)
then ``k`` values, padded to 8 bytes; ``to_wire`` clamps values to the largest finite in
both the wire dtype and the gradient's, so 16-bit values never overflow.
"""

from __future__ import annotations

import functools

import torch

from bench.comm.cost import packet_bytes


def index_dtype(numel: int) -> torch.dtype:
    return torch.int32 if numel < 2**31 else torch.int64


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
    ib, vb = k * idt.itemsize, k * vdtype.itemsize
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
