"""Alpha-beta model of gradient aggregation and of one data-parallel training step: each
collective is stages of ``steps * alpha + bytes / B`` plus per-element compute, calibrated
on micro-measurements only; a method's schedule of them is its spec's (bench/methods/).
docs/internals/cluster.md."""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.cluster import calibration
from bench.cluster.calibration import Costs
from bench.comm import cost

RESNET50_NUMEL = 25_557_032  # parameters of torchvision's ResNet-50
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"  # the runs' Hydra configs


@dataclass(frozen=True)
class Cluster:
    nodes: int
    procs_per_node: int
    inter_bw: float  # one node's link, bytes/s
    inter_lat: float = 0.0  # per message step, s
    intra_bw: float = 100e9  # between workers of one node, bytes/s (NVLink ~ 100 GB/s)
    intra_lat: float = 10e-6  # s
    hierarchical_dense: bool = False  # dense as NCCL's hierarchical allreduce
    # the compute-only step measured on this cluster (forward, backward, update, loader; s):
    # it replaces the workload's compute and update; None keeps them
    compute_s: float | None = None
    slowdown: float = 1.0  # how much slower each worker runs a cost than alone (shared cores)

    @property
    def world(self) -> int:
        return self.nodes * self.procs_per_node


def on_cluster(wl: Workload, c: Cluster, k: Costs) -> tuple[Workload, Cluster, Costs]:
    """The workload, cluster and costs with ``c``'s measured compute step and slowdown
    applied (pricing it again changes nothing)."""
    if c.compute_s is not None:
        wl = replace(wl, compute_s=c.compute_s, update_s=0.0)
    if c.slowdown != 1.0:
        k = k.scaled(c.slowdown)
    return wl, replace(c, compute_s=None, slowdown=1.0), k


@dataclass(frozen=True)
class Workload:
    buckets: tuple[int, ...]  # elements per gradient bucket, in the order DDP reduces them
    compute_s: float = 0.0  # forward + backward of one step
    backward_frac: float = 2 / 3  # share of compute that is the backward pass
    update_s: float = 0.0  # optimizer update
    # each bucket's parameter shapes (PowerSGD compresses the matrices); None = unknown
    shapes: tuple[tuple[tuple[int, ...], ...], ...] | None = None
    # share of each method's aggregation time hidden behind the backward pass (measured)
    hidden: Mapping[str, float] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return sum(self.buckets)


def buckets_for(numel: int, bucket_cap_mb: float = 25.0, elem_bytes: int = 4) -> tuple[int, ...]:
    """Split ``numel`` elements into DDP-style buckets of ``bucket_cap_mb`` MiB."""
    cap = max(1, int(bucket_cap_mb * 2**20 / elem_bytes))
    full, rest = divmod(numel, cap)
    return tuple([cap] * full + ([rest] if rest else []))


def transfer_time(t: cost.Traffic, c: Cluster) -> float:
    total = 0.0
    for s in t.stages:
        if s.inter:
            total += s.steps * c.inter_lat + s.link_bytes / c.inter_bw
        else:
            total += s.steps * c.intra_lat + s.worker_bytes / c.intra_bw
    return total


def ring_allreduce(d: float, c: Cluster, k: Costs, elem_bytes: int = 4) -> float:
    """Dense flat ring allreduce of ``d`` elements over all workers (s)."""
    if c.world == 1:
        return 0.0
    t = transfer_time(cost.allreduce(d, c.nodes, c.procs_per_node, elem_bytes), c)
    return t + (c.world - 1) / c.world * d * k.reduce_s


def nccl_allreduce(d: float, c: Cluster, k: Costs, elem_bytes: int = 4) -> float:
    """Hierarchical allreduce (intra reduce-scatter, inter ring, intra allgather) (s)."""
    n, m = c.nodes, c.procs_per_node
    if n == 1 or m == 1:
        return ring_allreduce(d, c, k, elem_bytes)
    t = transfer_time(cost.hierarchical_allreduce(math.ceil(d), n, m, elem_bytes), c)
    return t + ((m - 1) / m + (n - 1) / n / m) * d * k.reduce_s


def dense_allreduce(d: float, c: Cluster, k: Costs, elem_bytes: int = 4) -> float:
    """The cluster's dense allreduce: NCCL's hierarchical one or a flat ring (s)."""
    reduce = nccl_allreduce if c.hierarchical_dense else ring_allreduce
    return reduce(d, c, k, elem_bytes)


def lowrank_time(shapes: Sequence[Sequence[int]], rank: int, k: Costs) -> float:
    """PowerSGD's compute on the matrices of one bucket (s): per n x m matrix three
    products of 2 n m r flops and one QR of P (2 n r^2 flops)."""
    t = 0.0
    for s in shapes:
        if cost.powersgd_sizes([s], rank)[1]:  # a matrix it compresses
            n = s[0]
            m = math.prod(s) // n
            r = min(rank, n, m)
            t += 3 * (k.matmul_call_s + 2 * n * m * r * k.matmul_s)
            t += k.qr_call_s + 2 * n * r * r * k.qr_s
    return t


def powersgd(
    d: int, c: Cluster, k: Costs, shapes: Sequence[Sequence[int]] | None, rank: int
) -> float:
    """PowerSGD on one bucket: allreduces, 4 elementwise passes, low-rank compute (s)."""
    if c.world == 1:
        return 0.0
    plain, pq = cost.powersgd_sizes(shapes or [(d,)], rank)
    t = dense_allreduce(plain, c, k) if plain else 0.0
    if pq:  # P, then Q: two collectives
        t += 2 * dense_allreduce(pq / 2, c, k)
    return t + 4 * d * k.dense_s + lowrank_time(shapes or (), rank, k)


def topk_allgather(d: int, density: float, c: Cluster, k: Costs) -> float:
    """Flat top-k: select on the whole bucket, allgather pairs among all workers (s)."""
    kk = cost.k_for(d, density)
    t = transfer_time(cost.flat_topk(d, density, c.nodes, c.procs_per_node), c)
    # zero-fill and scaling of the rebuilt gradient
    return d * k.select_s + t + c.world * kk * k.scatter_s + 2 * d * k.dense_s


def hitopk(d: int, density: float, c: Cluster, k: Costs) -> float:
    """HiTopKComm: intra reduce-scatter, shard top-k, inter allgather, intra allgather (s)."""
    m = c.procs_per_node
    shard = -(-d // m)
    ks = cost.k_for(shard, density)
    t = transfer_time(cost.hitopk(d, density, c.nodes, m), c)
    t += (m - 1) / m * d * k.reduce_s
    t += shard * k.select_s  # error feedback + selection on the shard
    # rebuild: zero-fill, scatter-add, copy out of the padded buffer, scale
    return t + c.world * ks * k.scatter_s + 3 * d * k.dense_s


def demo_exchange(
    shapes: Sequence[Sequence[int]], chunk: int, topk: int, c: Cluster, k: Costs
) -> float:
    """DeMo's exchange in one optimizer step for parameters of ``shapes`` (s): DCTs and
    top-k per chunk, one flat ring allgather of every packet, the scatter of their pairs."""
    from bench.optim.demo import Chunking, packet_size  # deferred: imports torch

    chunks = [Chunking.of(s, chunk, topk) for s in shapes]
    numel = sum(math.prod(s) for s in shapes)
    pairs = sum(ch.pairs for ch in chunks)
    t = 0.0
    if c.world > 1:
        t = transfer_time(cost.demo(packet_size(chunks), c.nodes, c.procs_per_node), c)
    return t + numel * k.select_s + c.world * pairs * k.scatter_s + 3 * numel * k.dense_s


def demo_step_time(wl: Workload, chunk: int, topk: int, c: Cluster, k: Costs) -> float:
    """One DeMo training step (s): its exchange runs in the optimizer step (nothing hides)."""
    if wl.shapes is None:
        raise ValueError("DeMo's exchange needs the workload's parameter shapes")
    shapes = [s for b in wl.shapes for s in b]
    return wl.compute_s + demo_exchange(shapes, chunk, topk, c, k) + wl.update_s


def exposed(times: Sequence[float], wl: Workload, name: str) -> float:
    """The part of buckets aggregated in ``times`` (s, DDP's order) not hidden behind the
    backward pass: at least the last bucket, and the share ``wl.hidden[name]`` does not hide."""
    total = sum(times)
    last = times[-1] if times else 0.0
    backward = wl.backward_frac * wl.compute_s
    hidden = min(1.0, max(0.0, wl.hidden.get(name, 0.0)))
    return max(last, (1 - hidden) * total, total - backward)


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``t = alpha + s / B``: returns ``(alpha s, B bytes/s)``."""
    if len(sizes_bytes) != len(times_s) or len(sizes_bytes) < 2:
        raise ValueError("fit_alpha_beta needs at least two (size, time) pairs")
    n = len(sizes_bytes)
    mx, my = sum(sizes_bytes) / n, sum(times_s) / n
    sxx = sum((x - mx) ** 2 for x in sizes_bytes)
    if sxx == 0:
        raise ValueError("fit_alpha_beta needs at least two different sizes")
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes_bytes, times_s, strict=True)) / sxx
    alpha = max(0.0, my - slope * mx)
    return alpha, 1.0 / max(slope, 1e-30)


@dataclass
class Measurements:
    inter_bw: float | None = None  # bytes/s (link check), used without a ring shift
    inter_lat: float | None = None  # s (link check)
    # (bytes per message, s): one ring step over the inter-node link, every worker at once
    ring_shift: list[tuple[float, float]] = field(default_factory=list)
    # (bytes per message, s): the same ring shift among the m workers of each node
    intra_shift: list[tuple[float, float]] = field(default_factory=list)
    select: list[tuple[int, float]] = field(default_factory=list)  # (elements, s)
    scatter: list[tuple[int, float]] = field(default_factory=list)  # (pairs, s)
    dense_pass: list[tuple[int, float]] = field(default_factory=list)  # (elements, s)
    reduce: list[tuple[int, float]] = field(default_factory=list)  # (elements summed, s)


def _fit(pairs: list[tuple[float, float]]) -> tuple[float, float] | None:
    if len({s for s, _ in pairs}) < 2:
        return None
    return fit_alpha_beta([s for s, _ in pairs], [t for _, t in pairs])


def calibrate(base: Cluster, costs: Costs, meas: Measurements) -> tuple[Cluster, Costs]:
    """Replace the model's parameters by micro-measured ones (no end-to-end case)."""
    c, k = base, costs
    if meas.inter_bw is not None:
        c = replace(c, inter_bw=meas.inter_bw)
    if meas.inter_lat is not None:
        c = replace(c, inter_lat=meas.inter_lat)
    fit = _fit(meas.ring_shift) if c.nodes > 1 else None
    if fit is not None:
        c = replace(c, inter_lat=fit[0], inter_bw=fit[1])
    fit = _fit(meas.intra_shift) if c.procs_per_node > 1 else None
    if fit is not None:
        c = replace(c, intra_lat=fit[0], intra_bw=fit[1])
    for name, pairs in (
        ("select_s", meas.select),
        ("scatter_s", meas.scatter),
        ("dense_s", meas.dense_pass),
        ("reduce_s", meas.reduce),
    ):
        if pairs:
            k = replace(k, **{name: sum(t for _, t in pairs) / max(1, sum(n for n, _ in pairs))})
    return c, k


def outer_sync_time(numel: float, c: Cluster, elem_bytes: int = 4) -> float:
    """One ring all-reduce of ``numel`` elements between the nodes (s): each of a node's
    ``m`` workers runs its own ring across the nodes, all on the node's one link."""
    n = c.nodes
    if n < 2:
        return 0.0
    link = c.procs_per_node * elem_bytes * 2 * (n - 1) / n * numel
    return link / c.inter_bw + 2 * (n - 1) * c.inter_lat


def sync_step_time(
    wl: Workload, c: Cluster, inner_s: float, sync_every: int, fragments: int = 1, delay: int = 0
) -> float:
    """One inner step of Local SGD / DiLoCo (s): ``inner_s`` plus the outer all-reduce
    amortised over ``sync_every``; Streaming DiLoCo's ``fragments`` each overlap ``delay``
    inner steps."""
    if sync_every < 1 or fragments < 1 or delay < 0:
        raise ValueError("sync_every and fragments must be >= 1, delay >= 0")
    frag = outer_sync_time(wl.numel / fragments, c)
    return inner_s + fragments * max(0.0, frag - delay * inner_s) / sync_every


def link_efficiency() -> float:
    """Payload share of a shaped link carrying as much each way (TCP/IP framing, ACKs)."""
    payload = 2**20
    return payload / cost.on_wire(payload, payload)


def host_contention(nodes: int, procs: int, threads: int, cores: int) -> float:
    """How much slower each worker computes when all workers' threads share ``cores``."""
    return max(1.0, nodes * procs * threads / max(1, cores))


def emulated(
    bandwidth_bps: float, nnodes: int, nproc: int, compute_s: float, latency_s: float = 0.0002,
    loopback: tuple[float, float] | None = None,
) -> Cluster:  # fmt: skip
    """The emulated cluster of ``nnodes x nproc`` workers on this host: each node's link the
    tc-shaped ``bandwidth_bps`` (bits/s) with netem delay ``latency_s`` (s), its workers on
    loopback (s per message step, bytes/s; default this CPU's calibration rows),
    ``compute_s`` the compute-only step measured there, every cost slowed by the workers
    sharing this host's cores."""
    from bench.cluster.emulated import worker_threads  # deferred: the launcher's module

    if bandwidth_bps <= 0 or nnodes < 1 or nproc < 1 or compute_s < 0 or latency_s < 0:
        raise ValueError(f"emulated() needs a positive link, cluster and compute ({bandwidth_bps}, "
                         f"{nnodes} x {nproc}, {compute_s} s, {latency_s} s)")  # fmt: skip
    world = nnodes * nproc
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    f = host_contention(nnodes, nproc, worker_threads(0, world), cores or 1)
    lat, bw = loopback or calibration.loopback("cpu")
    return Cluster(nnodes, nproc, inter_bw=bandwidth_bps / 8 * link_efficiency(),
                   inter_lat=latency_s + lat * f, intra_bw=bw / f, intra_lat=lat * f,
                   compute_s=compute_s, slowdown=f)  # fmt: skip


def ddp_buckets(
    net: Any, bucket_cap_mb: float = 25.0
) -> tuple[tuple[int, ...], tuple[tuple[tuple[int, ...], ...], ...]]:
    """Each bucket's elements and parameter shapes as DDP buckets ``net`` at wrapping."""
    import torch.distributed as dist  # deferred: the shapes only

    rev = [p for p in reversed(list(net.parameters())) if p.requires_grad]
    limits = [dist._DEFAULT_FIRST_BUCKET_BYTES, int(bucket_cap_mb * 2**20)]
    assignment, _ = dist._compute_bucket_assignment_by_size(rev, limits, [False] * len(rev))
    shapes = tuple(tuple(tuple(rev[i].shape) for i in b) for b in assignment)
    return tuple(sum(math.prod(s) for s in b) for b in shapes), shapes


@functools.lru_cache(maxsize=8)
def workload_shapes(experiment: str) -> Workload:
    """``experiment``'s own network as the model prices it (built on the meta device,
    bucketed at its ``comm.bucket_cap_mb``), no compute."""
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from bench.comm.config import CommConfig
    from bench.data import build_data
    from bench.data.config import CacheConfig, DataConfig
    from bench.models import build_model
    from bench.models.config import ModelConfig
    from bench.registry import ConfigError

    # the YAML read through each group's own dataclass (the run schema is a floor above)
    store = ConfigStore.instance()
    if "base_config.yaml" not in store.repo:
        store.store(name="base_config", node={})
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            composed = compose(config_name="config", overrides=[f"experiment={experiment}"])
    except HydraException as e:
        raise ConfigError(f"experiment {experiment!r}: {str(e).splitlines()[0]}") from e
    cfg: Any = OmegaConf.to_container(composed, resolve=True)
    data = build_data(DataConfig(**cfg["data"]), CacheConfig(**cfg["cache"]), 0, 1,
                      torch.device("cpu"), 0)  # fmt: skip
    with torch.device("meta"):
        net = build_model(ModelConfig(**cfg["model"]), data.num_classes, data.in_channels)
    buckets, shapes = ddp_buckets(net, CommConfig(**cfg["comm"]).bucket_cap_mb)
    return Workload(buckets=buckets, shapes=shapes)
