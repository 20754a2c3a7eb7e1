"""What a hook reports per step: bytes sent (total, over a node's link), density, times.

Bytes come from the one cost function, :mod:`bench.comm.cost`.  ``time/select_s`` is the
compute a method adds around its collectives (a sum of durations); ``time/comm_s`` the
wall time during which at least one collective is in flight (a union of intervals).  CPU
tensors are timed on the host clock, CUDA ones with events (docs/internals/comm.md).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.comm import cost

Stamp = Any  # float (host seconds), torch.cuda.Event, or None (not timed)

_PENDING_MAX = 4096  # CUDA interval pairs kept before the completed ones are read


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by ``[start, end]`` intervals (overlaps counted once)."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


class PhaseTimes:
    """Select durations and comm intervals since the last :meth:`pop`; thread-safe (future
    callbacks record from the process groups' threads)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # CUDA only: host clocks cost nothing and are always on
        self._lock = threading.Lock()
        self._select = 0.0
        self._comm: list[tuple[float, float]] = []
        self._cuda: list[tuple[str, Any, Any]] = []  # (kind, start event, end event)
        self._ref: Any = None  # first CUDA event since the last pop: the time origin

    def now(self, like: torch.Tensor) -> Stamp:
        """A stamp on ``like``'s clock: host seconds, a recorded CUDA event, or None."""
        if not like.is_cuda:
            return time.perf_counter()
        if not self.enabled:
            return None
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(like.device))
        return ev

    def add_select(self, start: Stamp, end: Stamp) -> None:
        self._add("select", start, end)

    def add_comm(self, start: Stamp, end: Stamp) -> None:
        self._add("comm", start, end)

    def _add(self, kind: str, start: Stamp, end: Stamp) -> None:
        if start is None or end is None:
            return
        with self._lock:
            if isinstance(start, float):
                if kind == "select":
                    self._select += end - start
                else:
                    self._comm.append((start, end))
                return
            if self._ref is None:
                self._ref = start
            self._cuda.append((kind, start, end))
            if len(self._cuda) > _PENDING_MAX:
                self._read_cuda(wait=False)

    def _read_cuda(self, wait: bool) -> None:
        """Move completed CUDA pairs to the host totals (all of them with ``wait``)."""
        keep = []
        for kind, start, end in self._cuda:
            if not wait and not end.query():
                keep.append((kind, start, end))
                continue
            end.synchronize()
            if kind == "select":
                self._select += start.elapsed_time(end) / 1e3
            else:
                t0 = self._ref.elapsed_time(start) / 1e3
                self._comm.append((t0, t0 + start.elapsed_time(end) / 1e3))
        self._cuda = keep

    def pop(self) -> tuple[float, float]:
        """``(select_s, comm_s)`` totals since the last pop; starts over."""
        with self._lock:
            self._read_cuda(wait=True)
            out = (self._select, union_length(self._comm))
            self._select, self._comm, self._ref = 0.0, [], None
        return out


def ring(world: int, multinode: bool) -> tuple[int, int]:
    """(nodes, workers per node) of a flat ring: only whether it crosses nodes matters."""
    return (world, 1) if multinode else (1, world)


@dataclass
class CommStats:
    """Sums since the last :meth:`pop`; ``pop`` turns them into per-step means."""

    steps: int = 0
    bytes: float = 0.0  # bytes sent by this worker, all buckets
    inter_bytes: float = 0.0  # of which across nodes
    sent: float = 0.0  # elements sent (k per sparse bucket, numel per dense bucket)
    numel: float = 0.0  # elements reduced
    times: PhaseTimes = field(default_factory=PhaseTimes)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self, traffic: cost.Traffic, sent: float, numel: float) -> None:
        """One bucket: its ``traffic`` (:mod:`bench.comm.cost`), elements sent of ``numel``."""
        with self._lock:  # hitopk counts from its futures' callbacks
            self.bytes += traffic.worker_bytes
            self.inter_bytes += traffic.link_bytes
            self.sent += sent
            self.numel += numel

    def pop(self) -> dict[str, float]:
        s = max(self.steps, 1)
        select_s, comm_s = self.times.pop()
        with self._lock:
            out = {
                "comm/bytes_per_step": self.bytes / s,
                "comm/inter_node_bytes_per_step": self.inter_bytes / s,
                "comm/density": self.sent / self.numel if self.numel else 1.0,
                "time/select_s": select_s / s,
                "time/comm_s": comm_s / s,
            }
            self.steps, self.bytes, self.inter_bytes, self.sent, self.numel = 0, 0.0, 0.0, 0.0, 0.0
        return out
