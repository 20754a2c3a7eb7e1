"""Sums of :class:`bench.comm.cost.Traffic` that only the tests read."""

from __future__ import annotations

from bench.comm.cost import Traffic


def inter_worker_bytes(t: Traffic) -> float:
    """Bytes a worker sends in stages that cross nodes."""
    return sum(s.worker_bytes for s in t.stages if s.inter)
