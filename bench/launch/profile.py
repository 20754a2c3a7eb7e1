"""Named cluster profiles: an emulated link set so that this machine keeps the paper's ratio
of dense communication to compute per step (Shi et al., MLSys 2021: 16 x 8 V100, 25 Gbit/s).
Derivation: docs/internals/benchmarks.md (cluster profiles)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from bench import methods
from bench.benchmarks.timing import median_s
from bench.cluster import perfmodel as pm
from bench.cluster import projection
from bench.cluster.emulated import worker_threads
from bench.comm import cost
from bench.registry import ConfigError
from bench.train.workload import WORKLOADS

PAPER = {"nodes": 16, "procs_per_node": 8, "gbps": 25.0, "numel": 25_557_032}


@dataclass(frozen=True)
class Setting:
    """One point of the paper's setting: what a V100 computes per step, what dense sends."""

    batch: int  # images per GPU per step
    px: int  # training image size, px (square)
    wire_bytes: int  # bytes per gradient element on the wire: 4 fp32, 2 fp16
    why: str  # where the setting comes from

    @property
    def dense(self) -> str:
        """The first dense comm hook whose elements are this wide on the wire."""
        hooks = methods.specs(kind="hook")
        return next(s.name for s in hooks if not s.sparse and s.wire_bytes == self.wire_bytes)


SETTINGS: dict[str, Setting] = {
    "paper": Setting(
        256, 128, 4, "Shi et al. train mostly at 128 px (progressive resizing), 256 per V100"
    ),
    "paper-b64": Setting(
        64, 128, 4, "this project's ImageNet recipe: global batch 8192 over 16 x 8 = 64 per GPU"
    ),
    "paper-224": Setting(256, 224, 4, "the last phase of progressive resizing: 224 px"),
    "paper-fp16": Setting(
        256, 128, 2, "a mixed-precision recipe's dense baseline sends fp16 gradients"
    ),
}
PROFILES = tuple(SETTINGS)


def _setting(profile: str) -> Setting:
    check(profile)
    return SETTINGS[profile]


def dense_time_s(profile: str = "paper", nic_efficiency: float | None = None) -> float:
    """The paper cluster's dense aggregation time per step (s)."""
    st = _setting(profile)
    a = projection.ASSUMPTIONS
    nic = nic_efficiency if nic_efficiency is not None else a["nic_efficiency"].value
    c = projection.paper_cluster(PAPER["nodes"], PAPER["gbps"], nic, PAPER["procs_per_node"])
    spec = methods.get(st.dense)
    buckets = pm.buckets_for(PAPER["numel"])
    return spec.aggregation_time(buckets, c, projection.GPU_COSTS, spec.knobs_of({}))


def compute_time_s(profile: str = "paper") -> float:
    st = _setting(profile)
    return projection.v100_compute_s(st.batch, st.px)


def paper_ratio(
    compute_s: float | None = None,
    nic_efficiency: float | None = None,
    profile: str = "paper",
) -> float:
    compute = compute_s if compute_s is not None else compute_time_s(profile)
    return dense_time_s(profile, nic_efficiency) / compute


def derive(profile: str) -> dict[str, Any]:
    """Every input of ``profile``'s ratio with its source, and the ratio's band over the NIC
    efficiency: what the record and the report keep."""
    st = _setting(profile)
    a = projection.ASSUMPTIONS
    nic = a["nic_efficiency"]
    link = ring_link_bytes(PAPER["numel"], PAPER["nodes"], PAPER["procs_per_node"], st.wire_bytes)
    compute = compute_time_s(profile)
    ratios = [paper_ratio(None, e, profile) for e in (nic.low, nic.value, nic.high)]
    return {
        "profile": profile,
        "batch_per_gpu": st.batch,
        "image_px": st.px,
        "wire_bytes": st.wire_bytes,
        "setting_source": st.why,
        "compute_s": compute,
        "compute_source": f"{projection.V100_SOURCE}; x {st.batch}/1156 images x "
        f"({st.px}/224)**2 for the area",
        "dense_method": st.dense,
        "dense_s": dense_time_s(profile),
        "dense_source": "bench.cluster.perfmodel: NCCL hierarchical allreduce of "
        f"{PAPER['numel']:,} elements of {st.wire_bytes} B in 25 MiB buckets over "
        f"{PAPER['nodes']} x {PAPER['procs_per_node']} at {PAPER['gbps']:g} Gbit/s",
        "flat_ring_link_bytes": link,
        "nic_efficiency": nic.value,
        "nic_source": nic.source,
        "ratio": ratios[1],
        "ratio_low": min(ratios),
        "ratio_high": max(ratios),
    }


def ring_link_bytes(numel: int, nodes: int, procs: int, elem_bytes: int = 4) -> float:
    """Bytes a flat ring all-reduce in 25 MiB buckets sends over each node's link."""
    buckets = pm.buckets_for(numel)
    return sum(cost.allreduce(b, nodes, procs, elem_bytes).link_bytes for b in buckets)


def bandwidth_for_ratio(
    ratio: float, compute_s: float, numel: int, nodes: int, procs: int, elem_bytes: int = 4
) -> float:
    """Inter-node bits/s at which a dense ring all-reduce takes ``ratio * compute_s``."""
    if ratio <= 0 or compute_s <= 0:
        raise ConfigError(
            f"a profile needs a positive ratio and compute time ({ratio}, {compute_s})"
        )
    return ring_link_bytes(numel, nodes, procs, elem_bytes) * 8 / (ratio * compute_s)


def measure_compute_s(net: Any, batch: Any, reps: int = 3, loss: Any = None) -> float:
    """Median s of ``net``'s forward + backward on ``batch`` (``loss(net, batch)``; default:
    cross-entropy)."""
    if loss is None:

        def loss(n: Any, b: Any) -> Any:
            return torch.nn.functional.cross_entropy(n(b[0]), b[1])

    return median_s(lambda: loss(net, batch).backward(), reps=reps)


def resolve(
    profile: str | None, compute_s: float, numel: int, nodes: int, procs: int
) -> dict[str, Any] | None:
    """The emulated link for ``profile`` (None: none) given the compute time per step."""
    if profile is None:
        return None
    st = _setting(profile)
    ratio = paper_ratio(profile=profile)
    bps = bandwidth_for_ratio(ratio, compute_s, numel, nodes, procs, st.wire_bytes)
    return {
        "profile": profile,
        "compute_s": float(compute_s),
        "target_ratio": ratio,
        "derivation": derive(profile),
        "numel": numel,
        "bandwidth_bps": bps,
        "inter_node_bandwidth": f"{max(1, round(bps / 1e6))}mbit",
    }


def check(profile: str | None, cluster: str = "emulated") -> None:
    """ConfigError for an unknown profile, or a profile on a cluster with no link to shape."""
    if profile is None:
        return
    if profile not in PROFILES:
        raise ConfigError(f"unknown cluster profile {profile!r}; known: {', '.join(PROFILES)}")
    if cluster != "emulated":
        raise ConfigError(
            f"cluster.profile={profile} sets the emulated cluster's link; cluster {cluster} "
            "has no link to shape (use cluster=emulated, or drop cluster.profile)"
        )


def step_compute_s(cfg: Any, time_it: bool = True) -> dict[str, Any]:
    """One worker's forward + backward s per step on this host (timed alone, scaled by
    :func:`bench.cluster.perfmodel.host_contention`) and the parameter count."""
    c = cfg.cluster
    cores = os.cpu_count() or 1
    # the threads the launchers give each worker: every node's workers run on this host
    threads = worker_threads(c.threads_per_worker, c.nnodes * c.nproc_per_node)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.manual_seed(cfg.train.seed)
        world = c.nnodes * c.nproc_per_node
        wl = WORKLOADS.get(cfg.train.workload)(cfg, 0, world, torch.device("cpu"))
        numel = sum(p.numel() for p in wl.model.parameters() if p.requires_grad)
        if not time_it:
            return {"numel": numel}
        wl.data.train.set_epoch(0)
        batch = next(iter(wl.data.train))
        alone = measure_compute_s(wl.model, batch, loss=lambda n, b: wl.loss(n, b)[0])
    finally:
        torch.set_num_threads(before)
    factor = pm.host_contention(c.nnodes, c.nproc_per_node, threads, cores)
    return {
        "numel": numel,
        "compute_alone_s": alone,
        "contention": factor,
        "compute_s": alone * factor,
        "threads_per_worker": threads,
    }


def apply(cfg: Any) -> dict[str, Any] | None:
    """Set ``cluster.inter_node_bandwidth`` for ``cluster.profile`` from the compute per step
    (timed, or ``cluster.profile_compute_s``); what the record keeps."""
    c = cfg.cluster
    if c.profile is None:
        return None
    check(c.profile, c.name)
    given = c.profile_compute_s
    if given is not None and not given > 0:
        raise ConfigError(f"cluster.profile_compute_s must be > 0 s, got {given}")
    step = step_compute_s(cfg, time_it=given is None)
    compute = step["compute_s"] if given is None else float(given)
    out = resolve(c.profile, compute, step["numel"], c.nnodes, c.nproc_per_node)
    assert out is not None
    out["compute_measured_here"] = given is None
    out.update({k: v for k, v in step.items() if k not in ("numel", "compute_s")})
    c.inter_node_bandwidth = out["inter_node_bandwidth"]
    return out


def describe(p: dict[str, Any]) -> str:
    how = (
        f"timed here: {p['compute_alone_s'] * 1e3:.1f} ms alone x {p['contention']:.2f} "
        "host contention"
        if p.get("compute_measured_here")
        else "as given (cluster.profile_compute_s)"
    )
    return (
        f"cluster profile {p['profile']}: compute {p['compute_s'] * 1e3:.1f} ms per step "
        f"({how}), target dense comm / compute {p['target_ratio']:.2f} over "
        f"{p['numel']:,} parameters -> inter_node_bandwidth={p['inter_node_bandwidth']}"
    )
