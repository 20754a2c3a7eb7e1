"""What a hook reports per step: bytes sent (total, over a node's link; from
:mod:`bench.comm.cost`), density, ``time/select_s`` (the compute around the collectives, a
sum), ``time/comm_s`` (the time a collective is in flight, a union of intervals) and the
run-length log of the phase each step sent as (``comm/phases``).
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
    """Select durations and comm intervals since the last :meth:`pop`, on the host clock or
    CUDA events; thread-safe (callbacks record from the process groups' threads)."""

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
        """Completed CUDA pairs to the host totals (all of them with ``wait``)."""
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


PHASES = "comm/phases"  # the curve column of the phase log (:func:`format_phases`)


@dataclass(frozen=True)
class Segment:
    """Consecutive steps sent alike (``method``, ``density``, PowerSGD's ``rank``) and
    the ``bytes`` this worker sent over them all."""

    method: str
    density: float
    rank: int
    steps: int
    bytes: float

    @property
    def key(self) -> tuple[str, float, int]:
        return (self.method, self.density, self.rank)

    @property
    def bytes_per_step(self) -> float:
        return self.bytes / self.steps if self.steps else 0.0


def merge(segments: list[Segment]) -> list[Segment]:
    """``segments`` with neighbours of one phase joined (their steps and bytes summed)."""
    out: list[Segment] = []
    for s in segments:
        if out and out[-1].key == s.key:
            p = out[-1]
            out[-1] = Segment(p.method, p.density, p.rank, p.steps + s.steps, p.bytes + s.bytes)
        elif s.steps:
            out.append(s)
    return out


def format_phases(segments: list[Segment]) -> str:
    """``method/density/rank/steps/bytes per step`` per segment, ``;``-joined (one CSV cell)."""
    return ";".join(
        f"{s.method}/{s.density:g}/{s.rank}/{s.steps}/{s.bytes_per_step:.0f}" for s in segments
    )


def parse_phases(text: Any) -> list[Segment]:
    """:func:`format_phases` read back; ``[]`` for an empty or missing cell (NaN)."""
    if not isinstance(text, str) or not text:
        return []
    out = []
    for part in text.split(";"):
        m, d, r, n, b = part.split("/")
        out.append(Segment(m, float(d), int(r), int(n), float(b) * int(n)))
    return out


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
    # the phase log since the last pop: closed segments, the running step's phase and the
    # byte count when it began (a step's bytes: all counted until the next step begins)
    _segments: list[Segment] = field(default_factory=list, repr=False)
    _open: tuple[str, float, int] | None = field(default=None, repr=False)
    _open_bytes: float = field(default=0.0, repr=False)

    def begin_step(self, method: str, density: float, rank: int = 0) -> None:
        """A step starts, sent as ``method`` at ``density`` (PowerSGD's rank)."""
        with self._lock:
            self._close()
            self._open, self._open_bytes = (method, float(density), int(rank)), self.bytes

    def _close(self) -> None:
        if self._open is not None:
            seg = Segment(*self._open, 1, self.bytes - self._open_bytes)
            self._segments = merge([*self._segments, seg])
            self._open = None

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
            self._close()
            phases, self._segments = self._segments, []
            out = {
                "comm/bytes_per_step": self.bytes / s,
                "comm/inter_node_bytes_per_step": self.inter_bytes / s,
                "comm/density": self.sent / self.numel if self.numel else 1.0,
                "time/select_s": select_s / s,
                "time/comm_s": comm_s / s,
                **({PHASES: format_phases(phases)} if phases else {}),
            }
            self.steps, self.bytes, self.inter_bytes, self.sent, self.numel = 0, 0.0, 0.0, 0.0, 0.0
        return out
