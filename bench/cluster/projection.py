"""Projection of the performance model to the paper's cluster (16 x 8 V100, 25 Gbit/s),
every assumption with its band and source in :data:`ASSUMPTIONS`
(docs/internals/cluster.md)."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bench.cluster import perfmodel as pm

V100_IMG_PER_S_224 = 1156.0
V100_SOURCE = (
    "NVIDIA DeepLearningExamples, PyTorch ResNet-50 v1.5, pytorch-21.03: one V100 32GB "
    "1,156 img/s with mixed precision at 224 px"
)


def v100_compute_s(batch: int, px: int) -> float:
    """Forward + backward of ``batch`` images at ``px`` x ``px`` on one V100 (s), scaled
    from 224 px by the pixel count."""
    if batch < 1 or px < 1:
        raise ValueError(f"v100_compute_s needs a positive batch and size ({batch}, {px})")
    return batch / V100_IMG_PER_S_224 * (px / 224) ** 2


@dataclass(frozen=True)
class Assumption:
    value: float
    low: float
    high: float
    source: str


ASSUMPTIONS: dict[str, Assumption] = {
    "compute_s": Assumption(
        v100_compute_s(256, 128), v100_compute_s(256, 128), v100_compute_s(256, 224),
        f"ResNet-50 v1.5 forward+backward of 256 images per V100 ({V100_SOURCE}): 0.221 s at "
        "224 px; x (128/224)**2 for the area at 128 px, 0.072 s (the paper's progressive "
        "resizing trains mostly small)",
    ),
    "update_s": Assumption(
        0.002, 0.002, 0.002, "assumed: a fused update of 25.6 M parameters at ~150 GB/s"
    ),
    "backward_frac": Assumption(
        2 / 3, 2 / 3, 2 / 3, "assumed: backward is about twice the forward pass"
    ),
    "nic_efficiency": Assumption(
        0.7, 0.5, 0.9,
        "assumed: the share of a link's line rate that TCP reaches between cloud VMs (the "
        "paper's nodes are VMs on a 25 Gbit/s VPC); not measured on that network",
    ),
    "hidden": Assumption(
        1.0, 0.0, 1.0,
        "assumed, every method alike: DDP and Horovod start each fused bucket's collective "
        "as soon as its gradients are ready (Li et al., PyTorch Distributed, VLDB 2020; "
        "Sergeev and Del Balso, Horovod, 2018), so at most everything but the last bucket "
        "and what outlasts the backward pass hides; not measured on V100/NCCL here, so the "
        "band runs from nothing hidden to that limit",
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
    "matmul_s": Assumption(
        1 / 1.8e12, 1 / 1.8e12, 1 / 1.8e12,
        "assumed: PowerSGD's rank-4 product reads its n x m matrix once from HBM2 at 900 GB/s "
        "(2 n m r flops per 4 n m B: 1.8 Tflop/s at r = 4), s per flop",
    ),
    "matmul_call_s": Assumption(5e-6, 5e-6, 5e-6, "assumed: one CUDA kernel launch, s"),
    "qr_s": Assumption(1e-11, 1e-11, 1e-11, "assumed: cuSOLVER's QR of a thin n x r matrix at "
                       "~0.1 Tflop/s, s per flop"),
    "qr_call_s": Assumption(5e-5, 5e-5, 5e-5, "assumed: cuSOLVER's QR of a thin matrix is "
                            "latency-bound, about 10 kernels of 5 us per call"),
}  # fmt: skip
# no GPU has calibration rows for the projected V100s: their costs are all assumed
GPU_COSTS = pm.Costs(**{k: ASSUMPTIONS[k].value for k in (
    "select_s", "scatter_s", "dense_s", "reduce_s", "matmul_s", "matmul_call_s", "qr_s",
    "qr_call_s")})  # fmt: skip
# the network each workload's projection prices: the paper's ResNet-50, and the
# Transformer at the size the Transformer's papers train (base, a 32,000-token vocabulary)
PROJECTED_MODEL = {"classification": ("resnet50", 0), "translation": ("transformer_base", 32000)}


def paper_cluster(nodes: int, gbps: float, nic_efficiency: float, procs: int = 8) -> pm.Cluster:
    a = ASSUMPTIONS
    return pm.Cluster(nodes, procs, inter_bw=gbps * 1e9 / 8 * nic_efficiency,
                      inter_lat=a["inter_lat"].value, intra_bw=a["intra_bw"].value,
                      intra_lat=a["intra_lat"].value, hierarchical_dense=True)  # fmt: skip


@functools.lru_cache(maxsize=8)
def model_buckets(
    model: str = "resnet50", bucket_cap_mb: float = 25.0, vocab: int = 32000
) -> tuple[tuple[int, ...], tuple[tuple[tuple[int, ...], ...], ...]]:
    """A model's DDP buckets (torchvision's ``resnet50``, else :mod:`bench.models`'s with a
    ``vocab`` of tokens or classes, 10 when 0)."""
    import torch  # deferred: the shapes only, on the meta device

    with torch.device("meta"):
        if model == "resnet50":
            import torchvision

            net = torchvision.models.resnet50(weights=None)
        else:
            from bench.models import build_model
            from bench.models.config import ModelConfig

            net = build_model(ModelConfig(name=model), vocab or 10)
    return ddp_buckets(net, bucket_cap_mb)


ddp_buckets = pm.ddp_buckets


def paper_workload(
    compute_s: float,
    hidden: Mapping[str, float],
    buckets: Sequence[int] | None = None,
    shapes: Sequence[Sequence[Sequence[int]]] | None = None,
    workload: str = "classification",
) -> pm.Workload:
    """A workload on the paper's cluster (no ``buckets``: ``workload``'s projected network);
    the update scales the assumed ``update_s`` by the parameters (a pass over memory)."""
    if buckets is None:
        model, vocab = PROJECTED_MODEL[workload]
        buckets, shapes = model_buckets(model, vocab=vocab)
    return pm.Workload(
        buckets=tuple(buckets),
        compute_s=compute_s,
        backward_frac=ASSUMPTIONS["backward_frac"].value,
        update_s=ASSUMPTIONS["update_s"].value * sum(buckets) / pm.RESNET50_NUMEL,
        hidden=dict(hidden),
        shapes=tuple(tuple(tuple(s) for s in b) for b in shapes) if shapes else None,
    )


class Priced(Protocol):
    """What the projection asks of a method (a spec, passed in from above this layer)."""

    name: str

    def knobs_of(self, values: Mapping[str, Any]) -> Any: ...

    def step_time(self, wl: pm.Workload, c: pm.Cluster, costs: pm.Costs, k: Any) -> float: ...


def _efficiency(m: Priced, k: Any, n: int, g: float, compute: float, nic: float, h: float):
    wl = paper_workload(compute, {m.name: h})
    step = m.step_time(wl, paper_cluster(n, g, nic), GPU_COSTS, k)
    return step, (wl.compute_s + wl.update_s) / step


def project(
    methods: Sequence[Priced],
    hidden: Mapping[str, float] | None = None,
    gbps: Sequence[float] = (25, 100, 400),
    nodes: Sequence[int] = tuple(range(1, 17)),
    density: float = 0.001,
) -> list[dict[str, float | int | str]]:
    """Step time and scaling efficiency (central, band) of each of ``methods``; ``hidden``:
    a share measured on the projected hardware, else the assumption's band."""
    a = ASSUMPTIONS
    measured = dict(hidden or {})
    rows: list[dict[str, float | int | str]] = []
    for g, n, m in itertools.product(gbps, nodes, methods):
        k = m.knobs_of({"comm.density": density})
        h = measured.get(m.name, a["hidden"].value)
        hband = (h,) if m.name in measured else (a["hidden"].low, a["hidden"].high)
        step, eff = _efficiency(m, k, n, g, a["compute_s"].value, a["nic_efficiency"].value, h)
        band = [
            _efficiency(m, k, n, g, cs, nic, hh)[1]
            for cs in (a["compute_s"].low, a["compute_s"].high)
            for nic in (a["nic_efficiency"].low, a["nic_efficiency"].high)
            for hh in hband
        ]
        rows.append(
            {
                "gbps": g,
                "nodes": n,
                "procs_per_node": 8,
                "comm": m.name,
                "density": density,
                "step_ms": step * 1e3,
                "efficiency": eff,
                "efficiency_min": min(band + [eff]),
                "efficiency_max": max(band + [eff]),
                "hidden": h,
                "hidden_source": "measured" if m.name in measured else "assumed",
            }
        )
    return rows


def describe() -> str:
    return "\n".join(
        f"{name} = {x.value:g} (range {x.low:g}..{x.high:g}): {x.source}"
        for name, x in ASSUMPTIONS.items()
    )
