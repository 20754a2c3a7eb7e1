"""SparseLoCo (Sarfi et al. 2025) through torchft's DiLoCo (bench/sync/sparse.py): every H
inner steps each node sends the chunk-wise top-k of its error-fed pseudo-gradient in 2-bit
values; the global step is a plain averaged descent."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.cluster import perfmodel as pm
from bench.comm import cost
from bench.methods.kinds import SyncKnobs, SyncMethod
from bench.methods.spec import Knobs, Space, key, register
from bench.sync.sparse import Packet, chunk_packet, chunking


@dataclass(frozen=True)
class SparseLoCoKnobs(SyncKnobs):
    sync_every: int = key("sync.sync_every", 10)  # H: inner steps between outer steps
    outer_lr: float = key("sync.outer_lr", 1.0)  # the global step's rate
    outer_momentum: float = key("sync.outer_momentum", 0.0)  # none: a plain averaged descent
    density: float = key("sync.density", 0.015625)  # share of each chunk sent (its top-k)
    ef_beta: float = key("sync.ef_beta", 0.95)  # the error-feedback buffer's decay
    chunk_size: int = key("sync.chunk_size", 4096)  # elements per chunk
    quant_bits: int = key("sync.quant_bits", 2)  # bits per value sent (0: float32)


def space(workload: str, ref: int) -> Space:
    """H x density (the paper's 1-3 %: 64 and 128 of each 4096-element chunk)."""
    hs = (20, 50) if workload == "translation" else (10, 20)
    return {
        "H": tuple((f"H{h}", {"sync.sync_every": h}) for h in hs),
        "density": tuple((f"d{d:g}", {"sync.density": d}) for d in (0.015625, 0.03125)),
    }


def _numels(wl: pm.Workload) -> dict[str, int]:
    """The model's tensors (each bucket one tensor when the shapes are not known)."""
    if wl.shapes:
        flat = [s for b in wl.shapes for s in b]
        return {str(i): max(1, math.prod(s)) for i, s in enumerate(flat)}
    return {str(i): int(b) for i, b in enumerate(wl.buckets)}


@dataclass(frozen=True)
class SparseLoCo(SyncMethod):
    knob_type: type[Knobs] = SparseLoCoKnobs
    timed = (("sync_every", "H"), ("density", "d"), ("quant_bits", "q"), ("bucket_mb", "b"))

    def packet(self, numels: dict[str, int], k: Any) -> Packet:
        return chunk_packet(chunking(numels, k.chunk_size, k.density), k.chunk_size, k.quant_bits)

    def sync_traffic(self, wl: pm.Workload, n: int, m: int, k: Any) -> cost.Traffic:
        """One outer step: m all-gathers across nodes, all on the node's one link."""
        p = self.packet(_numels(wl), k).total
        return cost.Traffic(
            (cost.Stage("outer_allgather", (n - 1) * p, m * (n - 1) * p, n - 1, True),)
        )

    def price(self, wl: pm.Workload, c: pm.Cluster, costs: pm.Costs, k: Knobs) -> float:
        """The node's step, plus one outer step amortised over H."""
        assert isinstance(k, SparseLoCoKnobs)
        inner = self.inner_step(wl, c, costs)
        numels = _numels(wl)
        numel = sum(numels.values())
        sent = sum(t.rows * t.k for t in chunking(numels, k.chunk_size, k.density))
        sync = (
            numel * (costs.select_s + 2 * costs.dense_s)
            + pm.transfer_time(self.sync_traffic(wl, c.nodes, c.procs_per_node, k), c)
            + c.nodes * sent * costs.scatter_s
        )
        return inner + sync / max(1, k.sync_every)


register(
    SparseLoCo(
        "sparseloco", "SparseLoCo", "#e7ba52", "peer 2026", order=85,
        doc="top-k of DiLoCo's pseudo-gradient in 2-bit values, error feedback",
        default=True, spaces=space, lr_centre={},
    )
)  # fmt: skip
