"""The two per-step times of a gradient exchange, defined once for every method.

Every hook reports them through its state's ``stats`` (``pop_stats()`` of the training
controller: the ``time/select_s`` and ``time/comm_s`` columns of a training curve, and the
``select_ms`` / ``comm_ms`` columns of ``bench comm``), as means per step:

``time/select_s``
    The compute a method adds around its collectives, summed over the step's buckets:
    error feedback (adding the residual, keeping what was not sent), the top-k selection,
    the cast to the wire dtype, packing, unpacking, the scatter-add of the received
    values, zeroing and the division by the world size.  For the dense allreduce it is the
    cast, the division and the copy back.  It is a sum of durations: these segments keep
    a worker busy whether or not a collective is in flight.
``time/comm_s``
    The wall time during which at least one of the step's collectives is in flight: the
    *union* of the intervals [issued, completed] of every collective of the step, over all
    buckets and stages, not their sum.  With five dense buckets in flight together it is
    the time from the first issue to the last completion minus any gap with none in flight,
    so it never exceeds the step's wall time.  Steps do not overlap (DDP waits for every
    bucket before the next forward pass), so the union over all intervals since the last
    ``pop`` is the sum of the per-step unions.  ``powersgd`` runs PyTorch's own hook,
    whose compression compute is interleaved with its allreduces inside torch's future
    chain: its whole span counts as ``comm_s`` and its ``select_s`` is 0.

Clocks: CPU tensors are timed on the host with :func:`time.perf_counter` (a collective
completes when its future's callback runs).  CUDA tensors are timed only while
``enabled`` is set (``comm.timing``: off in training, on in ``bench comm``), with CUDA
events recorded on the current stream *of the tensor's device*: gloo runs callbacks on its
own threads, where the current device is 0, and an event pair on two devices cannot be
measured.  Inside a CUDA future's callback that stream is the one torch made wait for the
collective only, so an end stamp does not queue behind later backward kernels.  The
events are read when they have completed (or at :meth:`PhaseTimes.pop`), never waited for
while a step is in flight; all of one :class:`PhaseTimes` must be on one device (one
DDP model).  With timing off on CUDA both times read 0.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

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
