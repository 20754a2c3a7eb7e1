"""Named cluster profiles: an emulated link scaled so that this machine keeps the paper's
ratio of communication to computation.

``paper``: in Shi et al. (MLSys 2021), 16 nodes x 8 V100 (NVLink inside, 25 Gbit/s
between nodes) train ResNet-50 v1.5.  The performance model (dense as NCCL's hierarchical
allreduce, :mod:`bench.cluster.projection` for every assumed input and its source) gives
that cluster's dense aggregation time per step; divided by the V100's compute time per
step it is the target ratio.  Here, the model's forward + backward of one step is timed on
this machine, and the emulated inter-node bandwidth is chosen so that the bytes a dense
ring allreduce sends over each node's link (:mod:`bench.comm.cost`) take ``ratio x``
that compute time -- latency and this machine's reduction costs are left out, so the
emulated ratio is, if anything, a little higher than the target.

:func:`resolve` is what a launcher calls; its result says what was measured and chosen
(store it in the run's record).
"""

from __future__ import annotations

import time
from typing import Any

from bench.registry import ConfigError

PROFILES = ("paper",)
PAPER = {"nodes": 16, "procs_per_node": 8, "gbps": 25.0, "numel": 25_557_032}


def paper_ratio(compute_s: float | None = None, nic_efficiency: float | None = None) -> float:
    """Dense aggregation time over compute time per step on the paper's cluster."""
    from bench.cluster import perfmodel as pm
    from bench.cluster import projection

    a = projection.ASSUMPTIONS
    compute = compute_s if compute_s is not None else a["compute_s"].value
    nic = nic_efficiency if nic_efficiency is not None else a["nic_efficiency"].value
    c = projection.paper_cluster(PAPER["nodes"], PAPER["gbps"], nic, PAPER["procs_per_node"])
    buckets = pm.buckets_for(PAPER["numel"])
    return pm.aggregation_time("dense", buckets, 1.0, c, projection.GPU_COSTS) / compute


def bandwidth_for_ratio(
    ratio: float, compute_s: float, numel: int, nodes: int, procs: int
) -> float:
    """Inter-node bits/s at which a dense ring allreduce of ``numel`` fp32 elements over
    ``nodes`` x ``procs`` workers sends its link bytes in ``ratio * compute_s``."""
    from bench.cluster import perfmodel as pm
    from bench.comm import cost

    if ratio <= 0 or compute_s <= 0:
        raise ConfigError(
            f"a profile needs a positive ratio and compute time ({ratio}, {compute_s})"
        )
    link = cost.step("dense", pm.buckets_for(numel), 1.0, nodes, procs).link_bytes
    return link * 8 / (ratio * compute_s)


def measure_compute_s(net: Any, batch: Any, reps: int = 3) -> float:
    """Median time of ``net``'s forward + backward on ``batch`` (inputs, targets), s."""
    import statistics

    import torch

    x, y = batch
    times = []
    for _ in range(reps + 1):  # the first call warms up
        t0 = time.perf_counter()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def resolve(
    profile: str | None, net: Any, batch: Any, numel: int, nodes: int, procs: int
) -> dict[str, Any] | None:
    """The emulated link for ``profile`` (None: no profile): measured compute time, target
    ratio, chosen bandwidth (bits/s and in ``tc``'s spelling)."""
    if profile is None:
        return None
    if profile not in PROFILES:
        raise ConfigError(f"unknown cluster profile {profile!r}; known: {', '.join(PROFILES)}")
    compute = measure_compute_s(net, batch)
    ratio = paper_ratio()
    bps = bandwidth_for_ratio(ratio, compute, numel, nodes, procs)
    return {
        "profile": profile,
        "compute_s": compute,
        "target_ratio": ratio,
        "bandwidth_bps": bps,
        "inter_node_bandwidth": f"{max(1, round(bps / 1e6))}mbit",
    }
