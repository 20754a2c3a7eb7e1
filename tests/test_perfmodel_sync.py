"""The step-time model of the sync strategies: the outer all-reduce amortised over H
inner steps, Streaming DiLoCo's fragments hidden behind their delay."""

import pytest

from bench import methods as M
from bench.cluster import perfmodel as pm


def test_sync_step_time_amortises_the_outer_allreduce():
    c = pm.Cluster(nodes=4, procs_per_node=2, inter_bw=1e9, inter_lat=1e-3)
    k = pm.Costs()
    wl = pm.Workload(buckets=(1_000_000,), compute_s=0.1)
    dense = M.get("dense")
    inner = dense.step_time(wl, pm.Cluster(1, 2, 1e9, 1e-3), k, dense.knobs_of({}))
    # m 2(n-1)/n P/B + 2(n-1) alpha: each of a node's 2 workers rings the whole model
    outer = 2 * 4 * 2 * 3 / 4 * 1_000_000 / 1e9 + 2 * 3 * 1e-3
    assert pm.outer_sync_time(1_000_000, c) == pytest.approx(outer)
    t10 = pm.sync_step_time(wl, c, inner, sync_every=10)
    assert t10 == pytest.approx(inner + outer / 10)
    every = dense.step_time(wl, c, k, dense.knobs_of({}))
    assert pm.sync_step_time(wl, c, inner, sync_every=40) < t10 < every
    # the spec prices the node's step with its hook on one node
    dil = M.get("diloco")
    assert dil.step_time(wl, c, k, dil.knobs_of({"sync.sync_every": 10})) == pytest.approx(t10)
    # streaming: F fragments of P/F every H/F steps; a delay of one inner step hides them
    frag = pm.outer_sync_time(500_000, c)
    assert pm.sync_step_time(wl, c, inner, 10, fragments=2) == pytest.approx(inner + 2 * frag / 10)
    hidden = pm.sync_step_time(wl, c, inner, 10, fragments=2, delay=1)
    assert hidden == pytest.approx(inner + 2 * max(0.0, frag - inner) / 10)
    assert pm.outer_sync_time(1e6, pm.Cluster(1, 8, 1e9)) == 0.0
    with pytest.raises(ValueError):
        pm.sync_step_time(wl, c, inner, 0)
