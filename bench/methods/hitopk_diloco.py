"""The paper's HiTopKComm one level up, on DiLoCo's outer step (bench/sync/sparse.py):
every H inner steps local rank j of each node sends the MSTopK of shard j of the node's
pseudo-gradient, with error feedback, to local rank j of every node; the node all-gathers
the shards' packets and the outer SGD step applies their mean."""

from __future__ import annotations

from dataclasses import dataclass

from bench.cluster import perfmodel as pm
from bench.comm import cost
from bench.comm.cost import k_for
from bench.methods.kinds import SyncKnobs, SyncMethod
from bench.methods.spec import Knobs, Space, key, register
from bench.sync.sparse import shard_packet


@dataclass(frozen=True)
class OuterTopKKnobs(SyncKnobs):
    sync_every: int = key("sync.sync_every", 10)  # H: inner steps between outer steps
    outer_momentum: float = key("sync.outer_momentum", 0.0)  # none: the error feedback carries it
    density: float = key("sync.density", 0.01)  # share of each node shard sent (its MSTopK)
    ef_beta: float = key("sync.ef_beta", 1.0)  # the error-feedback buffer's decay


def space(workload: str, ref: int) -> Space:
    """H x density x the outer rate (at 2 x 2 translation missed at 0.7, reached at 1)."""
    return {
        "H": tuple((f"H{h}", {"sync.sync_every": h}) for h in (10, 20)),
        "density": tuple((f"d{d:g}", {"sync.density": d}) for d in (0.01, 0.05)),
        "outer": tuple((f"olr{o:g}", {"sync.outer_lr": o}) for o in (0.7, 1.0)),
    }


@dataclass(frozen=True)
class OuterHiTopK(SyncMethod):
    knob_type: type[Knobs] = OuterTopKKnobs
    timed = (("sync_every", "H"), ("density", "d"), ("bucket_mb", "b"))

    def sync_traffic(self, wl: pm.Workload, n: int, m: int, k: Knobs) -> cost.Traffic:
        """One outer step: each shard packet all-gathered across nodes, then inside."""
        p = shard_packet(wl.numel, m, getattr(k, "density", 0.01)).total
        inter = cost.Stage("outer_allgather", (n - 1) * p, m * (n - 1) * p, n - 1, True)
        intra = cost.Stage("intra_allgather", (m - 1) * n * p, 0.0, m - 1, False)
        return cost.Traffic((inter, intra) if m > 1 else (inter,))

    def price(self, wl: pm.Workload, c: pm.Cluster, costs: pm.Costs, k: Knobs) -> float:
        """The node's step, plus one outer step amortised over H."""
        assert isinstance(k, OuterTopKKnobs)
        n, m, numel = c.nodes, c.procs_per_node, wl.numel
        shard = -(-numel // m)
        costs = costs.using("mstopk")  # bench/sync/sparse.py's selector
        sync = (
            shard * (costs.select_s + costs.dense_s)
            + pm.transfer_time(self.sync_traffic(wl, n, m, k), c)
            + n * m * k_for(shard, k.density) * costs.scatter_s
            + 3 * numel * costs.dense_s
        )
        return self.inner_step(wl, c, costs) + sync / max(1, k.sync_every)


register(
    OuterHiTopK(
        "hitopk_diloco", "HiTopK-DiLoCo", "#d6616b", "paper", order=55,
        doc="HiTopKComm's MSTopK on DiLoCo's outer step, error feedback", default=True,
        spaces=space, width=2.4,
    )
)  # fmt: skip
