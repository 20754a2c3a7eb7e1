"""Projection of the performance model to the paper's cluster, with its assumptions.

The paper's setting (Shi et al., MLSys 2021): 16 nodes x 8 V100, NVLink inside a node,
25 Gbit/s Ethernet between nodes, ResNet-50.  None of it is measured here; every input is
in :data:`ASSUMPTIONS` with its value, the range the band spans and its source.  The
share of aggregation hidden behind the backward pass is measured per method (``bench
comm``'s overlap case) and passed in; with no measurement nothing is hidden.  Dense
aggregation is NCCL's hierarchical allreduce (:func:`perfmodel.nccl_allreduce`), the
strongest fair baseline, not a flat 128-rank ring.

:func:`project` returns, per link speed, node count and method, the central step time and
scaling efficiency and the band's minimum and maximum efficiency over every combination
of the ranged inputs (compute time, NIC efficiency, hidden share from none to measured).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bench.cluster import perfmodel as pm


@dataclass(frozen=True)
class Assumption:
    value: float
    low: float
    high: float
    source: str


ASSUMPTIONS: dict[str, Assumption] = {
    "compute_s": Assumption(
        0.074,
        0.074,
        0.221,
        "ResNet-50 v1.5 forward+backward of 256 images on one V100 32GB with mixed precision: "
        "1,156 img/s at 224 px (NVIDIA DeepLearningExamples, pytorch-21.03) gives 0.221 s; "
        "at 128 px about 3x less, 0.074 s (the paper's progressive resizing trains mostly "
        "small)",
    ),
    "update_s": Assumption(
        0.002, 0.002, 0.002, "assumed: a fused update of 25.6 M parameters at ~150 GB/s"
    ),
    "backward_frac": Assumption(
        2 / 3, 2 / 3, 2 / 3, "assumed: backward is about twice the forward pass"
    ),
    "nic_efficiency": Assumption(
        0.7,
        0.5,
        0.9,
        "assumed: the share of the 25 Gbit/s line rate TCP reaches between cloud VMs",
    ),
    "inter_lat": Assumption(50e-6, 50e-6, 50e-6, "assumed: one message step between VMs, s"),
    "intra_bw": Assumption(
        100e9, 100e9, 100e9, "assumed: NVLink (V100 NVLink2 has 6 x 25 GB/s per direction)"
    ),
    "intra_lat": Assumption(10e-6, 10e-6, 10e-6, "assumed: one NVLink message step, s"),
    "select_s": Assumption(
        1e-10, 1e-10, 1e-10, "assumed: GPU MSTopK, 0.1 ns per element (2.5 ms for ResNet-50)"
    ),
    "scatter_s": Assumption(1e-9, 1e-9, 1e-9, "assumed: GPU scatter-add, 1 ns per pair"),
    "dense_s": Assumption(2e-11, 2e-11, 2e-11, "assumed: an elementwise pass at ~200 GB/s"),
    "reduce_s": Assumption(2e-11, 2e-11, 2e-11, "assumed: a summation pass at ~200 GB/s"),
}
GPU_COSTS = pm.Costs(
    select_s=ASSUMPTIONS["select_s"].value,
    scatter_s=ASSUMPTIONS["scatter_s"].value,
    dense_s=ASSUMPTIONS["dense_s"].value,
    reduce_s=ASSUMPTIONS["reduce_s"].value,
)


def paper_cluster(nodes: int, gbps: float, nic_efficiency: float, procs: int = 8) -> pm.Cluster:
    a = ASSUMPTIONS
    return pm.Cluster(
        nodes,
        procs,
        inter_bw=gbps * 1e9 / 8 * nic_efficiency,
        inter_lat=a["inter_lat"].value,
        intra_bw=a["intra_bw"].value,
        intra_lat=a["intra_lat"].value,
        hierarchical_dense=True,
    )


def paper_workload(
    compute_s: float, hidden: Mapping[str, float], buckets: Sequence[int] | None = None
) -> pm.Workload:
    return pm.Workload(
        buckets=tuple(buckets or pm.buckets_for(pm.RESNET50_NUMEL)),
        compute_s=compute_s,
        backward_frac=ASSUMPTIONS["backward_frac"].value,
        update_s=ASSUMPTIONS["update_s"].value,
        hidden=dict(hidden),
    )


def _efficiency(comm: str, n: int, g: float, density: float, compute: float, nic: float, h: float):
    wl = paper_workload(compute, {comm: h})
    c = paper_cluster(n, g, nic)
    return pm.step_time(comm, wl, density, c, GPU_COSTS), pm.scaling_efficiency(
        comm, wl, density, c, GPU_COSTS
    )


def project(
    hidden: Mapping[str, float],
    gbps: Sequence[float] = (25, 100, 400),
    nodes: Sequence[int] = tuple(range(1, 17)),
    density: float = 0.001,
    comms: Sequence[str] = pm.COMMS,
) -> list[dict[str, float | int | str]]:
    """Step time and scaling efficiency (central, band minimum and maximum)."""
    a = ASSUMPTIONS
    rows: list[dict[str, float | int | str]] = []
    for g, n, comm in itertools.product(gbps, nodes, comms):
        h = hidden.get(comm, 0.0)
        step, eff = _efficiency(
            comm, n, g, density, a["compute_s"].value, a["nic_efficiency"].value, h
        )
        band = [
            _efficiency(comm, n, g, density, cs, nic, hh)[1]
            for cs in (a["compute_s"].low, a["compute_s"].high)
            for nic in (a["nic_efficiency"].low, a["nic_efficiency"].high)
            for hh in (0.0, h)
        ]
        rows.append(
            {
                "gbps": g,
                "nodes": n,
                "procs_per_node": 8,
                "comm": comm,
                "density": density,
                "step_ms": step * 1e3,
                "efficiency": eff,
                "efficiency_min": min(band + [eff]),
                "efficiency_max": max(band + [eff]),
                "hidden": h,
            }
        )
    return rows


def describe() -> str:
    """The assumptions as text lines (value, range, source)."""
    return "\n".join(
        f"{name} = {x.value:g} (range {x.low:g}..{x.high:g}): {x.source}"
        for name, x in ASSUMPTIONS.items()
    )
