"""Sweep helpers only the tests use."""

from __future__ import annotations

from collections.abc import Sequence

from bench.config import to_object
from bench.launch import profile
from bench.sweeps.common import compose


def pin_link(job: Sequence[str]) -> tuple[list[str], str]:
    """The paper-scaled bandwidth for ``job`` (the sweep's largest topology), as one
    ``cluster.inter_node_bandwidth=...`` for every run of a sweep whose topologies differ
    (the scaling study compares them over one link); with a line saying how it was chosen.
    No profile in ``job``: nothing."""

    cfg = to_object(compose(job))
    p = profile.apply(cfg)
    if p is None:
        return [], ""
    topo = f"{cfg.cluster.nnodes}x{cfg.cluster.nproc_per_node}"
    return [
        "cluster.profile=null",
        f"cluster.inter_node_bandwidth={p['inter_node_bandwidth']}",
    ], f"one link for every topology, chosen on {topo}: {profile.describe(p)}"
