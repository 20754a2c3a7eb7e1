"""Per-step statistics of a hook: bytes sent (total, inter-node), density, times.

The byte accounting of every method is here and only here (``*_traffic``), so a change of
cost model touches this module alone.  Bytes are what one worker sends per step:

- ring allreduce: ``2 (w-1)/w`` of the bucket;
- ring allgather: ``(w-1)`` packets;
- hitopk with ``n`` nodes of ``m`` workers: ``(m-1)/m`` of the bucket (intra-node
  reduce-scatter) + ``(n-1)`` packets (inter-node allgather) + ``(m-1) n`` packets
  (intra-node allgather).

Inter-node bytes are those on the slow links: for the flat rings every node boundary
carries the whole ring traffic, so they equal the worker's total when ``n > 1``; for
hitopk only the inter-node allgather crosses nodes.  The times are defined in
:mod:`bench.comm.timing`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from bench.comm.timing import PhaseTimes


def allreduce_traffic(nbytes: float, world: int, multinode: bool) -> tuple[float, float]:
    """(total, inter-node) bytes one worker sends in a ring allreduce of ``nbytes``."""
    total = 2.0 * (world - 1) / world * nbytes
    return total, total if multinode else 0.0


def allgather_traffic(packet: int, world: int, multinode: bool) -> tuple[float, float]:
    """(total, inter-node) bytes one worker sends in a ring allgather of ``packet`` bytes."""
    total = float((world - 1) * packet)
    return total, total if multinode else 0.0


def hitopk_traffic(bucket_bytes: float, packet: int, m: int, n: int) -> tuple[float, float]:
    """(total, inter-node) bytes one worker sends in hitopk's three stages."""
    intra = (m - 1) / m * bucket_bytes + (m - 1) * n * packet
    inter = float((n - 1) * packet)
    return intra + inter, inter


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
