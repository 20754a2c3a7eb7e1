"""The performance model's prediction of every step time the scaling study measures, made
before its first run from micro-measurements, and its projection to the paper's cluster
(docs/internals/sweeps.md)."""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from bench import methods
from bench.benchmarks.timing import median_s as _median_s
from bench.cluster import calibration, projection
from bench.cluster import perfmodel as pm
from bench.cluster.calibration import DCT
from bench.cluster.emulated import worker_threads
from bench.comm import cost
from bench.comm.selection import SELECTORS
from bench.launch.profile import ring_link_bytes
from bench.methods import Knobs

# each size's launch opens with WARMUP_RUNS runs of WARMUP_COMM, left out of its table: a
# communicating run, as compute-only runs before any communication in an emulated launch ran
# 1.3-6x slower than after it (sweep scaling-20261202-024650-351018)
WARMUP_RUNS = 1
WARMUP_COMM = methods.names(group="baseline")[0]
# compute-only runs after the warm-ups: the model's compute input at that size
CALIBRATION_RUNS = 1
CONCURRENT_STEPS = 10  # timed steps of :func:`concurrent_step_s` (after 3 untimed)
NOCOMM = methods.names(kind="reference")[0]  # the compute-only reference of every size
ASSUMED = {
    "hidden": 0.0,  # share of the aggregation hidden behind the backward pass
    "other_step_s": 0.0,  # data loader, loss and bookkeeping per step
}
HOLDS_WITHIN = 0.25  # the model "holds" where every |predicted / measured - 1| is below
PAPER = {"gbps": 25.0, "nodes": (1, 2, 4, 8, 16), "procs_per_node": 8}
SHIFT_BYTES = (4096, 262144, 2097152)  # the ring shift's message sizes


@dataclass
class Calibration:
    """What the model is calibrated on (s per element and per step, alone, one thread)."""

    buckets: tuple[int, ...]
    shapes: tuple[tuple[tuple[int, ...], ...], ...]
    reduce_s: float
    dense_s: float
    scatter_s: float
    # per top-k selector, per element scanned, error feedback included (DeMo's: its DCTs
    # and selection, less the three elementwise passes its model charges beside)
    select_s: dict[str, float]
    update_s: float
    msg_lat_s: float  # one gloo message step over loopback
    intra_bw: float  # bytes/s between workers of one node (loopback)
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    # PowerSGD's products and QR (s per flop and per call): this CPU's calibration rows
    lowrank: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("shapes")
        return d


def element_costs(buckets: Sequence[int], density: float, world: int = 8) -> dict[str, Any]:
    """Per-element costs on the largest bucket, alone on one thread (s per element)."""
    d = max(buckets)
    x, y = torch.randn(d), torch.randn(d)
    k = cost.k_for(d, density)
    reduce_s = _median_s(lambda: x.add_(y)) / d
    dense_s = _median_s(lambda: x.mul_(1.0)) / d
    select = {n: _median_s(lambda f=f: f(x, k)) / d + reduce_s for n, f in SELECTORS.items()}
    pairs = world * k
    v, i, out = torch.randn(pairs), torch.randint(d, (pairs,)), torch.zeros(d)
    scatter_s = _median_s(lambda: out.index_add_(0, i, v)) / pairs
    return {"reduce_s": reduce_s, "dense_s": dense_s, "select_s": select, "scatter_s": scatter_s}


def demo_select_s(net: torch.nn.Module, chunk: int, topk: int, dense_s: float) -> float:
    """DeMo's own work per element and step, alone on one thread (s): ``DeMo.extract`` and
    the average's inverse DCT, less the three elementwise passes the model charges beside."""
    from bench.optim.demo import DeMo  # deferred: only a sweep with DeMo needs it

    params = [p.detach().clone() for p in net.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = DeMo(params, chunk=chunk, topk=topk)

    def work() -> None:
        for p in params:
            ch, values, idx, _ = opt.extract(p, 0.999)
            ch.tensor(ch.scatter(values, idx))  # the average's inverse DCT

    numel = sum(p.numel() for p in params)
    return max(0.0, _median_s(work) / numel - 3 * dense_s)


def update_s(net: torch.nn.Module) -> float:
    """One SGD-momentum step over ``net``'s parameters, alone (s)."""
    params = [p.detach().clone().requires_grad_(True) for p in net.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4, foreach=True)
    return _median_s(opt.step)


def ring_shift(
    rank: int, world: int, sizes: Sequence[int], reps: int = 5, pick: Any = statistics.median
) -> list[list[float]]:
    """(bytes, s) per size of each worker sending to the next while receiving from the one
    before (``pick`` of the slowest rank's times); runs in ``spawn.run_workers``."""
    out = []
    for n in sizes:
        t, r = torch.ones(max(1, n // 4)), torch.empty(max(1, n // 4))
        times = []
        for i in range(reps + 1):
            dist.barrier()
            t0 = time.perf_counter()
            for q in (dist.isend(t, (rank + 1) % world), dist.irecv(r, (rank - 1) % world)):
                q.wait()
            dt = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            if i:
                times.append(dt.item())
        out.append([float(n), pick(times)])
    return out


def _concurrent_worker(rank: int, world: int, overrides: list[str], steps: int) -> float:
    """One of :func:`concurrent_step_s`'s workers: the size's workload with nothing sent;
    each step from a barrier to its slowest worker (median over ``steps``)."""
    from bench.config import to_object
    from bench.sweeps.common import compose
    from bench.train.workload import WORKLOADS

    cfg = to_object(compose(overrides))
    torch.manual_seed(cfg.train.seed)
    wl = WORKLOADS.get(cfg.train.workload)(cfg, rank, world, torch.device("cpu"))
    params = [p for p in wl.model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4, foreach=True)
    wl.data.train.set_epoch(0)
    batches = iter(wl.data.train)
    times = []
    for i in range(steps + 3):
        dist.barrier()
        t0 = time.perf_counter()
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(wl.data.train)
            batch = next(batches)
        opt.zero_grad(set_to_none=True)
        wl.loss(wl.model, batch)[0].backward()
        opt.step()
        dt = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if i >= 3:
            times.append(dt.item())
    return statistics.median(times)


def concurrent_step_s(overrides: Sequence[str], nodes: int, per_node: int) -> float:
    """The compute-only step of ``nodes x per_node`` workers at once on this host (s)."""
    from bench.benchmarks.spawn import run_workers  # deferred: spawns gloo workers

    world = nodes * per_node
    out = run_workers(_concurrent_worker, world, per_node, list(overrides), CONCURRENT_STEPS,
                      threads=worker_threads(0, world), timeout_s=600.0)  # fmt: skip
    return float(out[0])


def calibrate(
    net: torch.nn.Module, density: float, bucket_cap_mb: float, own: dict[str, Knobs] | None = None
) -> Calibration:
    """Every micro-measurement of :class:`Calibration` (about 10 s on 2 cores); ``own``:
    the knobs of each optimizer method the sweep runs."""
    from bench.benchmarks.spawn import run_workers  # deferred: spawns 2 gloo workers

    buckets, shapes = projection.ddp_buckets(net, bucket_cap_mb)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        el = element_costs(buckets, density)
        upd = update_s(net)
        for k in (own or {}).values():
            el["select_s"][DCT] = demo_select_s(net, k.chunk, k.topk, el["dense_s"])  # type: ignore[attr-defined]
    finally:
        torch.set_num_threads(before)
    shift = run_workers(ring_shift, 2, 2, list(SHIFT_BYTES))[0]
    lat, bw = pm.fit_alpha_beta([s for s, _ in shift], [t for _, t in shift])
    try:  # not timed here: the committed rows of this CPU kind (gpucheck calibrate --cpu)
        k = calibration.costs("cpu")
        low = {n: getattr(k, n) for n in ("matmul_s", "matmul_call_s", "qr_s", "qr_call_s")}
    except (FileNotFoundError, KeyError):
        low = {}  # PowerSGD's compute unpriced: the plan's calibration says so (empty)
    return Calibration(buckets, shapes, update_s=upd, msg_lat_s=lat, intra_bw=bw, lowrank=low,
                       **el)  # fmt: skip


def contention(nodes: int, per_node: int, cores: int) -> float:
    """How much slower a one-thread cost runs with this size's workers on the host."""
    world = nodes * per_node
    return pm.host_contention(nodes, per_node, worker_threads(0, world), cores)


def predict(
    comm: str,
    nodes: int,
    per_node: int,
    compute_s: float,
    link_bps: float | None,
    cal: Calibration,
    k: Knobs | None = None,
    update_included: bool = False,
) -> dict[str, float]:
    """The model's step time and compute-only step of ``comm`` at one size (s), from
    ``compute_s`` and the shaped link's ``link_bps`` (None: the loopback path)."""
    spec = methods.get(comm)
    k = spec.knobs_of({}) if k is None else k
    f = contention(nodes, per_node, cal.cores)
    costs = pm.Costs(scatter_s=cal.scatter_s, dense_s=cal.dense_s, reduce_s=cal.reduce_s,
                     selectors=cal.select_s, **cal.lowrank)  # fmt: skip
    inter_bw = link_bps / 8 * pm.link_efficiency() if link_bps else cal.intra_bw
    c = pm.Cluster(nodes, per_node, inter_bw=inter_bw, inter_lat=cal.msg_lat_s * f,
                   intra_bw=cal.intra_bw / f, intra_lat=cal.msg_lat_s * f, slowdown=f)  # fmt: skip
    wl = pm.Workload(
        buckets=cal.buckets,
        compute_s=compute_s,
        update_s=(0.0 if update_included else cal.update_s * f) + ASSUMED["other_step_s"],
        shapes=cal.shapes,
        hidden={comm: ASSUMED["hidden"], spec.comm: ASSUMED["hidden"]},
    )
    compute_only = wl.compute_s + wl.update_s
    alone = spec.kind == "reference" or nodes * per_node == 1
    step = compute_only if alone else spec.step_time(wl, c, costs, k)
    return {"predicted_step_s": step, "predicted_compute_only_step_s": compute_only}


def dense_link_s(numel: int, nodes: int, per_node: int, link_bps: float | None) -> float:
    """A dense ring allreduce's time on each node's link at ``link_bps`` (s; NaN unshaped)."""
    if not link_bps or nodes < 2:
        return math.nan
    return ring_link_bytes(numel, nodes, per_node) * 8 / link_bps


def projected_rows(comms: Sequence[str], measured_world: int) -> list[dict[str, Any]]:
    """The model's rows for the paper's cluster of the comm hooks among ``comms``."""
    hooks = [methods.get(c) for c in comms if c in methods.METHODS]
    hooks = [s for s in hooks if s.kind == "hook"]
    rows = projection.project(hooks, gbps=(PAPER["gbps"],), nodes=PAPER["nodes"])
    a = projection.ASSUMPTIONS
    compute_only = a["compute_s"].value + a["update_s"].value
    out = []
    for r in rows:
        n, m = int(r["nodes"]), int(r["procs_per_node"])
        eff = {k: float(r[k]) for k in ("efficiency", "efficiency_min", "efficiency_max")}
        out.append({
            "kind": "projected", "cluster": f"model: {n}x{m} V100, {r['gbps']:g} Gbit/s",
            "nodes": n, "workers_per_node": m, "world_size": n * m, "comm": r["comm"],
            "density": r["density"] if methods.get(str(r["comm"])).sparse else 1.0,
            "compute_only_step_s": compute_only, **eff,
            "predicted_step_s": float(r["step_ms"]) / 1e3,
            "predicted_efficiency": eff["efficiency"],
            "note": f"extrapolated {n * m / max(1, measured_world):.0f}x beyond the largest "
            f"measured size ({measured_world} CPU workers on tc-shaped links) to V100s, NVLink "
            "and NCCL at 25 Gbit/s, every input assumed (bench/cluster/projection.py ASSUMPTIONS)",
        })  # fmt: skip
    return out
