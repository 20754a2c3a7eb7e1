"""The performance model's prediction of every step time the scaling study measures, made
before the first run of the sweep, and its projection to the paper's cluster.

Calibrated on micro-measurements only, all made in the launcher before any training step
of the sweep (none of them is a step, so every measured step time is held out):

* **compute**: one worker's forward + backward at each size, as the paper-scaled profile
  times it (:func:`bench.launch.profile.step_compute_s`: alone, with the intra-op threads
  a worker of that size gets, times the host contention of that size's workers);
* **update**: one SGD-momentum step over the model's parameters, alone on one thread,
  times the same contention;
* **per-element costs**: a summation pass, an elementwise pass, each method's selection
  (``torch.topk``; MSTopK for ``mstopk`` and ``hitopk``) with its error-feedback add, and
  scatter-add, on the model's largest bucket, alone on one thread, times the contention;
* **messages**: a ring shift between 2 local gloo workers over loopback at a few sizes:
  per-message latency and the intra-node path (``perfmodel.fit_alpha_beta``);
* **the link**: the rate the size's profile chose (``tc`` shapes it to that rate and the
  link check holds it within 25 %), less TCP/IP framing (:func:`bench.comm.cost.on_wire`);
  on a cluster with no shaped link (``local``), the loopback path.

Assumed, not measured (:data:`ASSUMED`): nothing of the aggregation hides behind the
backward pass (the workers oversubscribe the cores, so the backward pass and the
collective's copies and sums compete for them), and a step's time beyond forward,
backward, aggregation and update (the data loader, the loss) is left out.

The projection rows are :func:`bench.cluster.projection.project` at 25 Gbit/s on 1-16
nodes x 8 V100 with its band; they say how far they extrapolate from what was measured.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from bench.cluster import perfmodel as pm
from bench.cluster import projection
from bench.cluster.emulated import worker_threads
from bench.comm import cost, mstopk
from bench.launch.profile import host_contention

WARMUP_RUNS = 2  # compute-only runs that open each size's launch, left out of its table
NOCOMM = "nocomm"  # the compute-only reference of every size (bench/comm/nocomm.py)
ASSUMED = {
    "hidden": 0.0,  # share of the aggregation hidden behind the backward pass
    "other_step_s": 0.0,  # data loader, loss and bookkeeping per step
}
HOLDS_WITHIN = 0.25  # the model "holds" where every |predicted / measured - 1| is below
PAPER = {"gbps": 25.0, "nodes": (1, 2, 4, 8, 16), "procs_per_node": 8}
SHIFT_BYTES = (4096, 262144, 2097152)  # the ring shift's message sizes


@dataclass
class Calibration:
    """What the model is calibrated on (per element and per step: alone, one thread)."""

    buckets: tuple[int, ...]
    shapes: tuple[tuple[tuple[int, ...], ...], ...]
    reduce_s: float
    dense_s: float
    scatter_s: float
    select_s: dict[str, float]  # per method, per element scanned (error feedback included)
    update_s: float
    msg_lat_s: float  # one gloo message step over loopback
    intra_bw: float  # bytes/s between workers of one node (loopback)
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("shapes")
        return d


def _median_s(fn: Callable[[], Any], reps: int = 5) -> float:
    fn()  # warm-up
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def element_costs(buckets: Sequence[int], density: float, world: int = 8) -> dict[str, Any]:
    """Per-element costs on the largest bucket, alone on one thread (s per element)."""
    d = max(buckets)
    x, y = torch.randn(d), torch.randn(d)
    k = cost.k_for(d, density)
    reduce_s = _median_s(lambda: x.add_(y)) / d
    dense_s = _median_s(lambda: x.mul_(1.0)) / d
    select = {
        "topk": _median_s(lambda: torch.topk(x.abs(), k)) / d + reduce_s,
        "mstopk": _median_s(lambda: mstopk(x, k)) / d + reduce_s,
    }
    pairs = world * k
    v, i, out = torch.randn(pairs), torch.randint(d, (pairs,)), torch.zeros(d)
    scatter_s = _median_s(lambda: out.index_add_(0, i, v)) / pairs
    return {"reduce_s": reduce_s, "dense_s": dense_s, "select_s": select, "scatter_s": scatter_s}


def update_s(net: torch.nn.Module) -> float:
    """One SGD-momentum step (torch's foreach) over ``net``'s parameters, alone (s)."""
    params = [p.detach().clone().requires_grad_(True) for p in net.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=5e-4, foreach=True)
    return _median_s(opt.step)


def ring_shift(rank: int, world: int, sizes: Sequence[int], reps: int = 5) -> list[list[float]]:
    """(bytes, s) per size of each worker sending to the next while receiving from the one
    before (the slowest rank's median); runs in :func:`bench.benchmarks.spawn.run_workers`."""
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
        out.append([float(n), statistics.median(times)])
    return out


def calibrate(net: torch.nn.Module, density: float, bucket_cap_mb: float) -> Calibration:
    """Every micro-measurement of :class:`Calibration` (about 10 s on 2 cores)."""
    from bench.benchmarks.spawn import run_workers  # deferred: spawns 2 gloo workers

    buckets, shapes = projection.ddp_buckets(net, bucket_cap_mb)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        el = element_costs(buckets, density)
        upd = update_s(net)
    finally:
        torch.set_num_threads(before)
    shift = run_workers(ring_shift, 2, 2, list(SHIFT_BYTES))[0]
    lat, bw = pm.fit_alpha_beta([s for s, _ in shift], [t for _, t in shift])
    return Calibration(buckets, shapes, update_s=upd, msg_lat_s=lat, intra_bw=bw, **el)


def contention(nodes: int, per_node: int, cores: int) -> float:
    """How much slower a one-thread cost runs with this size's workers on the host."""
    world = nodes * per_node
    return host_contention(nodes, per_node, worker_threads(0, world), cores)


def link_efficiency() -> float:
    """Payload share of a shaped link carrying as much each way (TCP/IP framing, ACKs)."""
    payload = 2**20
    return payload / cost.on_wire(payload, payload)


def predict(
    comm: str,
    nodes: int,
    per_node: int,
    compute_s: float,
    link_bps: float | None,
    cal: Calibration,
    density: float,
    powersgd_rank: int = 4,
) -> dict[str, float]:
    """The model's step time (and its compute-only step) of ``comm`` at one size (s).

    ``compute_s``: forward + backward per step at this size (the profile's timing);
    ``link_bps``: the shaped link's rate (None: no shaping, the loopback path)."""
    f = contention(nodes, per_node, cal.cores)
    sel = cal.select_s.get("topk" if comm == "topk" else "mstopk", 0.0)
    k = pm.Costs(select_s=sel * f, scatter_s=cal.scatter_s * f, dense_s=cal.dense_s * f,
                 reduce_s=cal.reduce_s * f)  # fmt: skip
    inter_bw = link_bps / 8 * link_efficiency() if link_bps else cal.intra_bw
    c = pm.Cluster(nodes, per_node, inter_bw=inter_bw, inter_lat=cal.msg_lat_s * f,
                   intra_bw=cal.intra_bw / f, intra_lat=cal.msg_lat_s * f)  # fmt: skip
    wl = pm.Workload(
        buckets=cal.buckets,
        compute_s=compute_s,
        update_s=cal.update_s * f + ASSUMED["other_step_s"],
        shapes=cal.shapes,
        powersgd_rank=powersgd_rank,
        hidden={comm: ASSUMED["hidden"]},
    )
    compute_only = wl.compute_s + wl.update_s
    if comm == NOCOMM or nodes * per_node == 1:
        step = compute_only
    else:
        step = pm.step_time(comm, wl, density, c, k)
    return {"predicted_step_s": step, "predicted_compute_only_step_s": compute_only}


def dense_link_s(numel: int, nodes: int, per_node: int, link_bps: float | None) -> float:
    """A dense ring allreduce's bytes over each node's link at ``link_bps`` (s): the link
    time of the profile's ratio (NaN without a shaped link)."""
    if not link_bps or nodes < 2:
        return math.nan
    link = cost.step("dense", pm.buckets_for(numel), 1.0, nodes, per_node).link_bytes
    return link * 8 / link_bps


def projected_rows(comms: Sequence[str], measured_world: int) -> list[dict[str, Any]]:
    """The model's rows for the paper's cluster (25 Gbit/s, 1-16 nodes x 8 V100), each
    with its band and how far it extrapolates from the largest measured size."""
    known = [c for c in comms if c in pm.KNOWN]
    rows = projection.project(gbps=(PAPER["gbps"],), nodes=PAPER["nodes"], comms=tuple(known))
    out = []
    for r in rows:
        n, m = int(r["nodes"]), int(r["procs_per_node"])
        step = float(r["step_ms"]) / 1e3
        a = projection.ASSUMPTIONS
        compute_only = a["compute_s"].value + a["update_s"].value
        out.append(
            {
                "kind": "projected",
                "cluster": f"model: {n}x{m} V100, {r['gbps']:g} Gbit/s",
                "nodes": n,
                "workers_per_node": m,
                "world_size": n * m,
                "comm": r["comm"],
                "density": r["density"] if r["comm"] in cost.FLAT + ("hitopk",) else 1.0,
                "compute_only_step_s": compute_only,
                "efficiency": float(r["efficiency"]),
                "efficiency_min": float(r["efficiency_min"]),
                "efficiency_max": float(r["efficiency_max"]),
                "predicted_step_s": step,
                "predicted_efficiency": float(r["efficiency"]),
                "note": (
                    f"extrapolated {n * m / max(1, measured_world):.0f}x beyond the largest "
                    f"measured size ({measured_world} CPU workers on tc-shaped links) to "
                    "V100s, NVLink and NCCL at 25 Gbit/s, every input assumed "
                    "(bench/cluster/projection.py ASSUMPTIONS)"
                ),
            }
        )
    return out
