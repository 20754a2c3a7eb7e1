"""Per-step statistics of a hook: bytes sent (total, inter-node), density, times.

The byte accounting of every method is here and only here (``*_traffic``), and each
function asks the project's one cost function, :mod:`bench.comm.cost`.  ``total`` is what
one worker sends per step; ``inter-node`` is what leaves each node over its link per step:
for the flat rings one worker's total when ``n > 1`` (one ring edge leaves each node); for
hitopk the inter-node allgather of all ``m`` workers of the node, which send at once.  The
times are defined in :mod:`bench.comm.timing`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from bench.comm import cost
from bench.comm.timing import PhaseTimes


def _flat(world: int, multinode: bool) -> tuple[int, int]:
    """(nodes, workers per node) of a flat ring: only whether it crosses nodes matters."""
    return (world, 1) if multinode else (1, world)


def allreduce_traffic(nbytes: float, world: int, multinode: bool) -> tuple[float, float]:
    """(total, inter-node) bytes of a ring allreduce of ``nbytes`` (see the docstring)."""
    t = cost.allreduce(nbytes, *_flat(world, multinode), elem_bytes=1)
    return t.worker_bytes, t.link_bytes


def allgather_traffic(packet: int, world: int, multinode: bool) -> tuple[float, float]:
    """(total, inter-node) bytes of a ring allgather of ``packet``-byte packets."""
    t = cost.allgather(packet, *_flat(world, multinode))
    return t.worker_bytes, t.link_bytes


def hitopk_traffic(bucket_bytes: float, packet: int, m: int, n: int) -> tuple[float, float]:
    """(total, inter-node) bytes of hitopk's three stages."""
    t = cost.hitopk_stages(bucket_bytes, packet, n, m)
    return t.worker_bytes, t.link_bytes


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

    def count(self, traffic: tuple[float, float], sent: float, numel: float) -> None:
        """One bucket: ``traffic`` from a ``*_traffic`` function, elements sent of ``numel``."""
        with self._lock:  # hitopk counts from its futures' callbacks
            self.bytes += traffic[0]
            self.inter_bytes += traffic[1]
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
