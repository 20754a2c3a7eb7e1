"""The kinds of method a spec can be, each pricing and recognising itself its own way; a
method file picks one and fills in its name, colour, group and search space."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from bench.cluster import calibration
from bench.cluster import perfmodel as pm
from bench.comm import cost
from bench.methods.spec import METHODS, Knobs, MethodSpec, key


@dataclass(frozen=True)
class SparseKnobs(Knobs):
    # the top-k is taken per bucket: its boundaries change what is selected
    bucket_mb: float = key("comm.bucket_cap_mb", 25.0)
    density: float = key("comm.density", 0.01)  # share of each bucket's elements sent
    density_schedule: tuple[float, ...] = key("comm.density_schedule", ())  # warm-up densities
    schedule_steps: int = key("comm.schedule_steps", 0)  # optimizer steps per schedule entry
    warmup_steps: int = key("comm.warmup_steps", 0)  # dense optimizer steps first
    placement: str = key("comm.placement", "grad")  # what is compressed (comm/placement.py)


@dataclass(frozen=True)
class SparseMethod(MethodSpec):
    """Top-k of every bucket with error feedback, exchanged by one flat all-gather of the
    selected (value, index) pairs among all workers."""

    knob_type: type[Knobs] = SparseKnobs
    sparse: ClassVar[bool] = True
    label_keys: ClassVar[tuple[tuple[str, str], ...]] = (
        ("d", "comm.density"), ("wu", "comm.warmup_epochs"), ("schedule", "comm.density_schedule")
    )  # fmt: skip
    timed = (("density", "d"), ("density_schedule", ""), ("bucket_mb", "b"))

    def bucket_traffic(
        self, numel: int, n: int, m: int, k: Knobs, shapes: Any = None
    ) -> cost.Traffic:
        d = getattr(k, "density", 1.0)
        if d >= 1.0 or numel < cost.MIN_NUMEL or n * m == 1:
            return cost.allreduce(numel, n, m)
        return self.sparse_traffic(numel, d, n, m)

    def sparse_traffic(self, numel: int, d: float, n: int, m: int) -> cost.Traffic:
        return cost.flat_topk(numel, d, n, m)

    def bucket_time(self, d: int, c: pm.Cluster, costs: pm.Costs, k: Knobs, shapes: Any) -> float:
        density = getattr(k, "density", 1.0)
        if density >= 1.0 or d < cost.MIN_NUMEL or c.world == 1:
            return pm.dense_allreduce(d, c, costs) + d * costs.dense_s
        # its selector's cost: a hierarchical method's shard selector, else its own
        return self.sparse_time(d, density, c, costs.using(getattr(k, "selector", self.comm)))

    def sparse_time(self, d: int, density: float, c: pm.Cluster, costs: pm.Costs) -> float:
        return pm.topk_allgather(d, density, c, costs)

    def density_at(self, k: Knobs, step: int) -> float:
        """The density optimizer ``step`` sends (1.0 in the dense warm-up)."""
        assert isinstance(k, SparseKnobs)
        if step < k.warmup_steps:
            return 1.0
        if k.density_schedule and k.schedule_steps:
            i = (step - k.warmup_steps) // k.schedule_steps
            return float(k.density_schedule[min(i, len(k.density_schedule) - 1)])
        return k.density

    def phases(self, k: Knobs, steps: Sequence[int]) -> list[tuple[str, Knobs]]:
        out = []
        for s in steps:
            d = self.density_at(k, s)
            out.append(("dense" if d >= 1.0 else self.name, replace(k, density=d)))
        return out


@dataclass(frozen=True)
class ShardKnobs(SparseKnobs):
    selector: str = key("comm.selector", "mstopk")  # the top-k selector of each node's shard


@dataclass(frozen=True)
class HierarchicalMethod(SparseMethod):
    """HiTopKComm: a reduce-scatter inside each node, the top-k of each shard exchanged
    between the nodes, an all-gather inside each node."""

    knob_type: type[Knobs] = ShardKnobs
    min_nodes: int = 2
    one_node: tuple[str, ...] = ("comm.procs_per_node=1",)

    def sparse_traffic(self, numel: int, d: float, n: int, m: int) -> cost.Traffic:
        return cost.hitopk(numel, d, n, m)

    def sparse_time(self, d: int, density: float, c: pm.Cluster, costs: pm.Costs) -> float:
        return pm.hitopk(d, density, c, costs)


@dataclass(frozen=True)
class RankKnobs(Knobs):
    # the low-rank approximation's matrices and their random start are per bucket
    bucket_mb: float = key("comm.bucket_cap_mb", 25.0)
    rank: int = key("comm.powersgd_rank", 4)  # the low-rank approximation's rank
    warmup_steps: int = key("comm.warmup_steps", 0)  # all-reduce before max(2, this) steps


@dataclass(frozen=True)
class LowRankMethod(MethodSpec):
    """PowerSGD (torch's hook): all-reduces of P and Q, plain tensors whole."""

    lossy: ClassVar[bool] = True  # a rank-r approximation at any setting

    knob_type: type[Knobs] = RankKnobs
    label_keys: ClassVar[tuple[tuple[str, str], ...]] = (("r", "comm.powersgd_rank"),)
    timed = (("rank", "rank"), ("bucket_mb", "b"))

    def bucket_traffic(
        self, numel: int, n: int, m: int, k: Knobs, shapes: Any = None
    ) -> cost.Traffic:
        plain, pq = cost.powersgd_sizes(shapes or [(numel,)], getattr(k, "rank", 4))
        return cost.allreduce(plain, n, m, 4, "allreduce_plain") + cost.allreduce(
            pq, n, m, 4, "allreduce_pq"
        )

    def bucket_time(self, d: int, c: pm.Cluster, costs: pm.Costs, k: Knobs, shapes: Any) -> float:
        return pm.powersgd(d, c, costs, shapes, getattr(k, "rank", 4))

    def phases(self, k: Knobs, steps: Sequence[int]) -> list[tuple[str, Knobs]]:
        start = max(2, getattr(k, "warmup_steps", 0))
        return [("dense" if s < start else self.name, k) for s in steps]


@dataclass(frozen=True)
class ChunkKnobs(Knobs):
    chunk: int = key("optim.demo_chunk", 64)  # elements per DCT chunk
    topk: int = key("optim.demo_topk", 32)  # components sent per chunk


@dataclass(frozen=True)
class OptimizerMethod(MethodSpec):
    """An optimizer that exchanges its own compressed state (DeMo): DDP's all-reduce is
    switched off (its runs record ``comm=nocomm``), the exchange runs in the update."""

    knob_type: type[Knobs] = ChunkKnobs
    optim: str = ""  # the optimizer (conf/optim/<optim>.yaml) it is
    kind: ClassVar[str] = "optimizer"
    exchange_in_update: ClassVar[bool] = True
    timed = (("chunk", "chunk"), ("topk", "topk"), ("bucket_mb", "b"))

    def overrides(self) -> list[str]:
        return [f"optim={self.optim}", f"comm={self.comm}", *self.extra_overrides]

    def matches(self, rec: Mapping[str, Any]) -> bool:
        return ((rec.get("config") or {}).get("optim") or {}).get("name") == self.optim

    def traffic(self, buckets, n, m, k, shapes=None) -> cost.Traffic:  # type: ignore[override]
        from bench.optim.demo import Chunking, packet_size

        flat = [s for b in shapes or () for s in b]
        chunks = [Chunking.of(s, getattr(k, "chunk", 64), getattr(k, "topk", 32)) for s in flat]
        return cost.demo(packet_size(chunks), n, m)

    def price(self, wl: pm.Workload, c: pm.Cluster, costs: pm.Costs, k: Knobs) -> float:
        chunk, topk = getattr(k, "chunk", 64), getattr(k, "topk", 32)
        return pm.demo_step_time(wl, chunk, topk, c, costs.using(calibration.DCT))


@dataclass(frozen=True)
class SyncKnobs(Knobs):
    sync_every: int = key("sync.sync_every", 50)  # H: inner steps between outer syncs
    fragments: int = key("sync.fragments", 1)  # fragments synchronised in turn
    fragment_sync_delay: int = key("sync.fragment_sync_delay", 0)  # inner steps overlapped
    outer_lr: float = key("sync.outer_lr", 0.7)  # the outer step's rate
    outer_momentum: float = key("sync.outer_momentum", 0.9)  # the outer step's momentum


@dataclass(frozen=True)
class SyncMethod(MethodSpec):
    """A sync strategy (bench/sync/, through torchft): one replica per node trained with
    DDP inside the node, the nodes synchronised every H inner steps."""

    knob_type: type[Knobs] = SyncKnobs
    min_nodes: int = 2
    kind: ClassVar[str] = "sync"
    timed = (("sync_every", "H"), ("fragments", "frag"), ("fragment_sync_delay", "delay"),
             ("bucket_mb", "b"))  # fmt: skip

    @property
    def comm(self) -> str:
        return self.hook or "dense"

    def overrides(self) -> list[str]:
        return [f"sync={self.name}", *self.extra_overrides]

    def matches(self, rec: Mapping[str, Any]) -> bool:
        return ((rec.get("config") or {}).get("sync") or {}).get("name") == self.name

    def period(self, k: Knobs) -> int:
        return max(1, getattr(k, "sync_every", 1))

    def sync_traffic(self, wl: pm.Workload, n: int, m: int, k: Knobs) -> cost.Traffic:
        return cost.allreduce(wl.numel, n, m)

    def traffic(self, buckets, n, m, k, shapes=None) -> cost.Traffic:  # type: ignore[override]
        """One outer synchronisation's bytes per inner step (amortised over H)."""
        h = self.period(k)
        wl = pm.Workload(buckets=tuple(buckets), shapes=shapes)
        return cost.Traffic(
            tuple(
                replace(s, worker_bytes=s.worker_bytes / h, link_bytes=s.link_bytes / h)
                for s in self.sync_traffic(wl, n, m, k).stages
            )
        )

    def inner_step(self, wl: pm.Workload, c: pm.Cluster, costs: pm.Costs) -> float:
        """One inner step, its hook's exchange inside one node (s)."""
        return METHODS.get(self.comm).step_time(wl, replace(c, nodes=1), costs, Knobs())

    def price(self, wl: pm.Workload, c: pm.Cluster, costs: pm.Costs, k: Knobs) -> float:
        assert isinstance(k, SyncKnobs)
        inner = self.inner_step(wl, c, costs)
        return pm.sync_step_time(wl, c, inner, k.sync_every, k.fragments, k.fragment_sync_delay)


@dataclass(frozen=True)
class ReferenceMethod(MethodSpec):
    """A measurement device, not a method: the compute-only step (nothing sent)."""

    kind: ClassVar[str] = "reference"

    def bucket_traffic(
        self, numel: int, n: int, m: int, k: Knobs, shapes: Any = None
    ) -> cost.Traffic:
        return cost.Traffic(())

    def price(self, wl: pm.Workload, c: pm.Cluster, costs: pm.Costs, k: Knobs) -> float:
        return wl.compute_s + wl.update_s


# the sparse hooks' search spaces: the warm-up's densities above the final one
WARMUP_SCHEDULE = (0.1, 0.05, 0.03)
WARMUP_SHARE = 0.25  # the sparse warm-up: WARMUP_SCHEDULE over this share of dense's steps
# the translation sparse methods' dense warm-up: about 16 % of dense's steps to target
WARMUP_DENSE_SHARE = 1 / 6


def _schedule_knob(ref: int, densities: tuple[float, ...] = (0.01, 0.001)) -> dict:
    """density {none, warm-up} x final ``densities``: the warm-up spans WARMUP_SHARE of
    ``ref`` steps, so every labelled density is sent well before dense's target."""
    opts = []
    for d in densities:
        above = [x for x in WARMUP_SCHEDULE if x > d]
        every = max(1, round(WARMUP_SHARE * ref / len(above)))
        opts.append((f"d{d:g}", {"comm.density": d, "comm.density_schedule": []}))
        warm = {
            "comm.density": d,
            "comm.density_schedule": [*above, d],
            "comm.schedule_steps": every,
        }
        opts.append((f"d{d:g}-warmup{every * len(above)}", warm))
    return {"schedule": tuple(opts)}


def _placement_knob(*names: str, **extra: Any) -> dict:
    return {"placement": tuple((n, {"comm.placement": n, **extra}) for n in names)}


def sparse_space(workload: str, ref: int) -> dict:
    """Image: the density schedule x placement {grad, grad+dgc}.  Translation (AdamW): the
    final density x placement {grad, update}, after a dense warm-up (Adam's variance)."""
    if workload != "translation":
        return {**_schedule_knob(ref), **_placement_knob("grad", "grad+dgc")}
    dens = {"density": tuple((f"d{d:g}", {"comm.density": d}) for d in (0.05, 0.01))}
    warm = round(WARMUP_DENSE_SHARE * ref)
    return {**dens, **_placement_knob("grad", "update", **{"comm.warmup_steps": warm})}
