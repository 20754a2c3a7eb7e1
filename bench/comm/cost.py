"""Bytes of gradient aggregation, the project's one cost function: the stages of one
bucket's exchange among ``n`` nodes of ``m`` workers, each with the bytes a worker sends,
the bytes leaving a node over its link and its message steps (docs/internals/comm.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bench.registry import ConfigError

ALIGN = 8  # packet padding (bytes)
MIN_NUMEL = 16384  # buckets below this go through dense allreduce (the hooks' default)


@dataclass(frozen=True)
class Stage:
    name: str
    worker_bytes: float  # bytes each worker sends
    link_bytes: float  # bytes leaving each node over its inter-node link
    steps: int  # sequential message steps (latency terms)
    inter: bool  # the stage's messages cross nodes


@dataclass(frozen=True)
class Traffic:
    """The stages of aggregating some buckets, and their sums."""

    stages: tuple[Stage, ...]

    @property
    def worker_bytes(self) -> float:
        return sum(s.worker_bytes for s in self.stages)

    @property
    def link_bytes(self) -> float:
        return sum(s.link_bytes for s in self.stages)

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.stages + other.stages)


def k_for(numel: int, density: float) -> int:
    """Elements sent of ``numel`` at ``density`` (at least 1 when numel > 0)."""
    if not 0.0 < density <= 1.0:
        raise ConfigError(f"density must be in (0, 1], got {density}")
    return min(numel, max(1, math.ceil(density * numel))) if numel else 0


def packet_bytes(k: int, numel: int, value_bytes: int = 4) -> int:
    """One worker's packet of ``k`` (index, value) pairs of a ``numel``-element tensor."""
    index_bytes = 4 if numel < 2**31 else 8
    return -(-k * (index_bytes + value_bytes) // ALIGN) * ALIGN


def allreduce(
    numel: float, n: int, m: int, elem_bytes: int = 4, name: str = "allreduce"
) -> Traffic:
    """Flat ring allreduce among all ``w`` workers."""
    w = n * m
    if w == 1:
        return Traffic(())
    b = 2 * (w - 1) / w * numel * elem_bytes
    return Traffic((Stage(name, b, b if n > 1 else 0.0, 2 * (w - 1), n > 1),))


def hierarchical_allreduce(numel: int, n: int, m: int, elem_bytes: int = 4) -> Traffic:
    """NCCL's hierarchical allreduce: intra-node reduce-scatter, inter-node ring allreduce
    of each ``1/m`` shard (the node's ``m`` rings share its link), intra-node allgather."""
    shard = -(-numel // m) * elem_bytes
    intra = (m - 1) * shard
    inter = 2 * (n - 1) / n * shard
    return Traffic(
        (
            Stage("intra_reduce_scatter", intra, 0.0, m - 1, False),
            Stage("inter_allreduce", inter, m * inter, 2 * (n - 1), True),
            Stage("intra_allgather", intra, 0.0, m - 1, False),
        )
    )


def allgather(packet: int, n: int, m: int, name: str = "allgather") -> Traffic:
    """Flat ring allgather of one ``packet``-byte packet per worker among all workers."""
    w = n * m
    b = float((w - 1) * packet)
    return Traffic((Stage(name, b, b if n > 1 else 0.0, w - 1, n > 1),))


def demo(packet: int, n: int, m: int) -> Traffic:
    """DeMo's step (bench/optim/demo.py): one flat ring allgather of every ``packet``."""
    return allgather(packet, n, m, "demo_allgather")


def flat_topk(numel: int, density: float, n: int, m: int, value_bytes: int = 4) -> Traffic:
    """A flat top-k exchange: every worker's ``k`` pairs to every worker."""
    return allgather(packet_bytes(k_for(numel, density), numel, value_bytes), n, m, "allgather")


def hitopk(
    numel: int, density: float, n: int, m: int, elem_bytes: int = 4, value_bytes: int = 4
) -> Traffic:
    """HiTopKComm's three stages."""
    shard = -(-numel // m)
    pkt = packet_bytes(k_for(shard, density), shard, value_bytes)
    return hitopk_stages(shard * m * elem_bytes, pkt, n, m)


def hitopk_stages(bucket_bytes: float, packet: int, n: int, m: int) -> Traffic:
    """HiTopKComm's stages for a (padded) bucket of ``bucket_bytes``; ``m`` at once on a link."""
    stages = []
    if m > 1:
        rs = (m - 1) / m * bucket_bytes
        stages.append(Stage("intra_reduce_scatter", rs, 0.0, m - 1, False))
    if n > 1:
        inter = float((n - 1) * packet)
        stages.append(Stage("inter_allgather", inter, m * inter, n - 1, True))
    if m > 1:
        stages.append(Stage("intra_allgather", float((m - 1) * n * packet), 0.0, m - 1, False))
    return Traffic(tuple(stages))


def powersgd_sizes(
    shapes: Sequence[Sequence[int]], rank: int, min_compression_rate: float = 2.0
) -> tuple[int, int]:
    """Elements PowerSGD allreduces for one bucket."""
    plain = pq = 0
    for s in shapes:
        numel = math.prod(s)
        if len(s) <= 1:
            plain += numel
            continue
        rows, cols = s[0], numel // s[0]
        r = min(rank, rows, cols)
        if (rows + cols) * r * min_compression_rate < rows * cols:
            pq += (rows + cols) * r
        else:
            plain += numel
    return plain, pq


# --- TCP/IP framing, for comparison with interface counters ----------------------------
HEADER_BYTES = 66  # Ethernet 14 + IPv4 20 + TCP 20 + timestamps option 12
MSS = 1448  # TCP payload of a 1500-byte MTU segment with timestamps


def on_wire(sent: float, received: float, segment: int = MSS, ack_every: int = 2) -> float:
    """Bytes an interface transmits for ``sent`` payload bytes out and ``received`` in."""
    data = sent + math.ceil(sent / segment) * HEADER_BYTES
    acks = math.ceil(math.ceil(received / segment) / ack_every) * HEADER_BYTES
    return data + acks
