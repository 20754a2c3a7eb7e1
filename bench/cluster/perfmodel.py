"""Alpha-beta model of gradient aggregation and of one data-parallel training step.

Sending ``s`` bytes over a link costs ``alpha + s / B`` (latency alpha in s, bandwidth B
in bytes/s).  With ``n`` nodes of ``m`` workers (world ``w = n m``), a bucket of ``d``
elements of ``b`` bytes, density ``rho`` and ``p`` bytes per sent (value, index) pair:

* dense ring allreduce (gloo, NCCL): ``2 (w-1)`` steps each moving ``d b / w``; with
  ``n > 1`` every step waits for a ring edge that crosses a node boundary, so
  ``T = 2 (w-1)/w * d b / B_inter + 2 (w-1) alpha_inter`` (``B_intra``/``alpha_intra``
  when ``n = 1``), plus the summation, ``(w-1)/w * d`` element additions.
* flat top-k allgather (``mstopk``, ``topk``): every worker selects ``k = rho d`` of its
  whole bucket and a ring allgather moves ``(w-1)`` chunks of ``k p`` bytes:
  ``T = t_sel(d) + (w-1) (k p / B + alpha) + t_scatter(w k) + 3 t_dense(d)`` (error-feedback
  add, zero-fill and scaling, as bench.comm's communicators do them).
* ``hitopk`` (HiTopKComm, Shi et al., MLSys 2021; the algorithm and its cost are described
  in ``docs/algorithms.md``): intra-node reduce-scatter
  ``(m-1)/m * d b / B_intra + (m-1) alpha_intra``; selection on the ``d/m`` shard,
  ``k_s = rho d / m``; inter-node allgather among same-local-rank workers
  ``(n-1) * k_s p / (B_inter / m) + (n-1) alpha_inter`` -- the ``m`` allgathers of a node
  run at once and share its one link, hence ``B_inter / m``, where the paper's rough cost
  charges each of them the whole link ``B_inter``; intra-node allgather
  ``(m-1) * n k_s p / B_intra + (m-1) alpha_intra``; scatter-add of the ``n rho d``
  received pairs into the dense gradient (plus one elementwise pass on the shard and three
  on the bucket).

Buckets below ``min_numel`` elements go through dense allreduce.  One step is
``compute + max(0, T_comm - overlap * backward) + update``: communication hides behind
the part ``overlap`` of the backward pass (DDP starts a bucket once its gradients exist).
Scaling efficiency (weak scaling, fixed batch per worker) is ``t_single / t_step``.

Compute costs of the aggregation (selection, scatter-add, dense passes) are per element
and come from measurements (:func:`calibrate`), as do the link parameters (the link
check of the emulated cluster, or :func:`fit_alpha_beta` on timed transfers).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

COMMS = ("dense", "mstopk", "hitopk")  # the hook names of bench.comm this model covers
FLAT = ("topk", "mstopk", "randomk")  # flat allgather of selected pairs: one formula
RESNET50_NUMEL = 25_557_032  # parameters of torchvision's ResNet-50


@dataclass(frozen=True)
class Cluster:
    """Topology and link parameters (bandwidths in bytes/s, latencies in s)."""

    nodes: int
    procs_per_node: int
    inter_bw: float  # one node's link, bytes/s
    inter_lat: float = 0.0  # one-way, s
    intra_bw: float = 100e9  # between workers of one node, bytes/s (NVLink ~ 100 GB/s)
    intra_lat: float = 10e-6
    # effective bandwidth of the intra-node reduce-scatter (bytes of the input per s, at
    # (m-1)/m of them moved); None = intra_bw.  Collective libraries on CPUs reach far less
    # in a reduce-scatter than an allreduce suggests (gloo), so it is calibrated on its own.
    intra_rs_bw: float | None = None

    @property
    def world(self) -> int:
        return self.nodes * self.procs_per_node


@dataclass(frozen=True)
class Costs:
    """Per-element compute costs of aggregation (s per element) and sizes (bytes)."""

    elem_bytes: int = 4  # gradient element (fp32)
    pair_bytes: int = 8  # fp32 value + int32 index
    select_s: float = 0.0  # top-k selection, per element scanned
    scatter_s: float = 0.0  # scatter-add, per received pair
    dense_s: float = 0.0  # one elementwise pass (zero, add residual, scale), per element
    reduce_s: float = 0.0  # summation inside a reduction, per element added


@dataclass(frozen=True)
class Workload:
    """A model's gradient and compute time of one step per worker (s)."""

    buckets: tuple[int, ...]  # elements per gradient bucket
    compute_s: float = 0.0  # forward + backward of one step
    backward_frac: float = 2 / 3  # share of compute that is the backward pass
    update_s: float = 0.0  # optimizer update
    overlap: float = 0.0  # share of the backward pass that can hide communication

    @property
    def numel(self) -> int:
        return sum(self.buckets)


def buckets_for(numel: int, bucket_cap_mb: float = 25.0, elem_bytes: int = 4) -> tuple[int, ...]:
    """Split ``numel`` elements into DDP-style buckets of ``bucket_cap_mb`` MiB."""
    cap = max(1, int(bucket_cap_mb * 2**20 / elem_bytes))
    full, rest = divmod(numel, cap)
    return tuple([cap] * full + ([rest] if rest else []))


def ring_allreduce(d: int, c: Cluster, k: Costs) -> float:
    """Dense ring allreduce of ``d`` elements over all ``w`` workers (s)."""
    w = c.world
    if w == 1:
        return 0.0
    bw, lat = (c.inter_bw, c.inter_lat) if c.nodes > 1 else (c.intra_bw, c.intra_lat)
    return (
        2 * (w - 1) / w * d * k.elem_bytes / bw + 2 * (w - 1) * lat + (w - 1) / w * d * k.reduce_s
    )


def ring_allgather(chunk_bytes: float, parties: int, bw: float, lat: float) -> float:
    """Ring allgather: ``parties - 1`` steps of one chunk each (s)."""
    if parties <= 1:
        return 0.0
    return (parties - 1) * (chunk_bytes / bw + lat)


def topk_allgather(d: int, density: float, c: Cluster, k: Costs) -> float:
    """Flat top-k: select on the whole bucket, allgather pairs among all workers (s)."""
    kk = max(1, math.ceil(density * d))
    bw, lat = (c.inter_bw, c.inter_lat) if c.nodes > 1 else (c.intra_bw, c.intra_lat)
    return (
        d * k.select_s
        + ring_allgather(kk * k.pair_bytes, c.world, bw, lat)
        + c.world * kk * k.scatter_s
        + 3 * d * k.dense_s  # error-feedback add; zero-fill and scaling of the rebuilt gradient
    )


def hitopk(d: int, density: float, c: Cluster, k: Costs) -> float:
    """HiTopKComm: intra reduce-scatter, shard top-k, inter allgather, intra allgather (s)."""
    n, m = c.nodes, c.procs_per_node
    shard = d / m
    ks = max(1, math.ceil(density * shard))
    t = 0.0
    if m > 1:  # intra-node reduce-scatter
        t += (m - 1) / m * d * k.elem_bytes / (c.intra_rs_bw or c.intra_bw) + (m - 1) * c.intra_lat
        t += (m - 1) / m * d * k.reduce_s
    t += shard * (k.select_s + k.dense_s)  # error feedback + selection on the shard
    # m parallel allgathers share the node's link: each gets B_inter / m
    t += ring_allgather(ks * k.pair_bytes, n, c.inter_bw / m, c.inter_lat)
    t += ring_allgather(n * ks * k.pair_bytes, m, c.intra_bw, c.intra_lat)
    # rebuild: zero-fill, scatter-add, copy out of the padded buffer, scale
    t += n * m * ks * k.scatter_s + 3 * d * k.dense_s
    return t


def aggregation_time(
    comm: str,
    buckets: Iterable[int],
    density: float,
    c: Cluster,
    k: Costs,
    min_numel: int = 16384,
) -> float:
    """Time to aggregate all buckets one after the other (s)."""
    if comm not in COMMS and comm not in FLAT:
        raise ValueError(f"unknown comm {comm!r}; the model knows {', '.join(COMMS + FLAT)}")
    total = 0.0
    for d in buckets:
        if comm == "dense" or d < min_numel or c.world == 1:
            total += ring_allreduce(d, c, k) + d * k.dense_s  # and the division by w
        elif comm in FLAT:
            total += topk_allgather(d, density, c, k)
        else:
            total += hitopk(d, density, c, k)
    return total


def step_time(comm: str, wl: Workload, density: float, c: Cluster, k: Costs) -> float:
    """One training step: compute, the exposed part of aggregation, update (s)."""
    t_comm = aggregation_time(comm, wl.buckets, density, c, k)
    hidden = wl.overlap * wl.backward_frac * wl.compute_s
    return wl.compute_s + max(0.0, t_comm - hidden) + wl.update_s


def scaling_efficiency(comm: str, wl: Workload, density: float, c: Cluster, k: Costs) -> float:
    """Throughput per worker relative to one worker without communication."""
    single = wl.compute_s + wl.update_s
    return single / step_time(comm, wl, density, c, k)


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
    """What :func:`calibrate` reads; any field left ``None`` keeps the default."""

    inter_bw: float | None = None  # bytes/s (link check)
    inter_lat: float | None = None  # s, one way (link check)
    # (bytes, s) of ring allreduces among all workers of n > 1 nodes: when given, the
    # inter-node link is fitted from them (what the collective library achieves on the
    # link) instead of being taken from inter_bw / inter_lat
    world_allreduce: list[tuple[float, float]] = field(default_factory=list)
    intra_allreduce: list[tuple[float, float]] = field(
        default_factory=list
    )  # (bytes, s), m workers
    intra_reduce_scatter: list[tuple[float, float]] = field(
        default_factory=list
    )  # (input bytes, s)
    select: list[tuple[int, float]] = field(default_factory=list)  # (elements, s)
    scatter: list[tuple[int, float]] = field(default_factory=list)  # (pairs, s)
    dense_pass: list[tuple[int, float]] = field(default_factory=list)  # (elements, s)


def _per_elem(pairs: list[tuple[int, float]]) -> float:
    return sum(t for _, t in pairs) / max(1, sum(n for n, _ in pairs))


def calibrate(base: Cluster, costs: Costs, meas: Measurements) -> tuple[Cluster, Costs]:
    """Replace the model's parameters by measured ones.

    The intra-node bandwidth comes from allreduce timings among the ``m`` workers of a
    node: a ring allreduce of ``s`` bytes moves ``2 (m-1)/m s`` per worker, so the fit of
    ``t`` against ``2 (m-1)/m s`` gives ``(2 (m-1) alpha, B)``; likewise the inter-node
    link from allreduces among all ``w`` workers, ``(2 (w-1) alpha, B)``.
    """
    c, k = base, costs
    if meas.inter_bw is not None:
        c = replace(c, inter_bw=meas.inter_bw)
    if meas.inter_lat is not None:
        c = replace(c, inter_lat=meas.inter_lat)
    w = c.world
    if meas.world_allreduce and c.nodes > 1 and len({s for s, _ in meas.world_allreduce}) >= 2:
        f = 2 * (w - 1) / w
        a, bw = fit_alpha_beta(
            [f * s for s, _ in meas.world_allreduce], [t for _, t in meas.world_allreduce]
        )
        c = replace(c, inter_bw=bw, inter_lat=a / (2 * (w - 1)))
    m = c.procs_per_node
    if meas.intra_allreduce and m > 1:
        f = 2 * (m - 1) / m
        if len({s for s, _ in meas.intra_allreduce}) >= 2:
            a, bw = fit_alpha_beta(
                [f * s for s, _ in meas.intra_allreduce], [t for _, t in meas.intra_allreduce]
            )
            c = replace(c, intra_bw=bw, intra_lat=a / (2 * (m - 1)))
        else:
            s, t = meas.intra_allreduce[0]
            c = replace(c, intra_bw=f * s / t)
    if meas.intra_reduce_scatter and m > 1:
        # the latency is the allreduce's; the slope gives the reduce-scatter's bandwidth
        f = (m - 1) / m
        rs = [(f * b, t - (m - 1) * c.intra_lat) for b, t in meas.intra_reduce_scatter]
        c = replace(c, intra_rs_bw=sum(b for b, _ in rs) / max(1e-12, sum(t for _, t in rs)))
    if meas.select:
        k = replace(k, select_s=_per_elem(meas.select))
    if meas.scatter:
        k = replace(k, scatter_s=_per_elem(meas.scatter))
    if meas.dense_pass:
        k = replace(k, dense_s=_per_elem(meas.dense_pass))
    return c, k


# --- the paper's cluster, for projections ---------------------------------------------
# Assumptions (not measurements): V100 ResNet-50 mixed precision ~1250 images/s, 64 per
# GPU per step -> 50 ms forward+backward, 2 ms update; NVLink ~100 GB/s effective per GPU;
# a GPU top-k (MSTopK) ~0.1 ns per element (2.5 ms for ResNet-50); scatter-add 1 ns per
# pair; elementwise passes at ~200 GB/s; half of the backward pass can hide communication.
PAPER_COSTS = Costs(select_s=1e-10, scatter_s=1e-9, dense_s=2e-11)
PAPER_WORKLOAD = Workload(
    buckets=buckets_for(RESNET50_NUMEL), compute_s=0.05, update_s=0.002, overlap=0.5
)


def project(
    gbps: Sequence[float] = (25, 100, 400),
    nodes: Sequence[int] = tuple(range(1, 17)),
    procs_per_node: int = 8,
    density: float = 0.001,
    wl: Workload = PAPER_WORKLOAD,
    costs: Costs = PAPER_COSTS,
    inter_lat: float = 50e-6,
) -> list[dict[str, float | int | str]]:
    """Scaling efficiency for ``nodes`` x ``procs_per_node`` GPUs at each link speed."""
    rows: list[dict[str, float | int | str]] = []
    for g in gbps:
        for n in nodes:
            c = Cluster(n, procs_per_node, inter_bw=g * 1e9 / 8, inter_lat=inter_lat)
            for comm in COMMS:
                rows.append(
                    {
                        "gbps": g,
                        "nodes": n,
                        "procs_per_node": procs_per_node,
                        "comm": comm,
                        "density": density,
                        "step_ms": step_time(comm, wl, density, c, costs) * 1e3,
                        "efficiency": scaling_efficiency(comm, wl, density, c, costs),
                    }
                )
    return rows
