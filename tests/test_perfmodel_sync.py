"""The step-time model of the sync strategies: the outer all-reduce amortised over H
inner steps, Streaming DiLoCo's fragments hidden behind their delay."""

import pytest

from bench.cluster import perfmodel as pm


def test_sync_step_time_amortises_the_outer_allreduce():
    c = pm.Cluster(nodes=4, procs_per_node=2, inter_bw=1e9, inter_lat=1e-3)
    k = pm.Costs()
    wl = pm.Workload(buckets=(1_000_000,), compute_s=0.1)
    inner = pm.step_time("dense", wl, 1.0, pm.Cluster(1, 2, 1e9, 1e-3), k)
    # m 2(n-1)/n P/B + 2(n-1) alpha: each of a node's 2 workers rings the whole model
    outer = 2 * 4 * 2 * 3 / 4 * 1_000_000 / 1e9 + 2 * 3 * 1e-3
    assert pm.outer_sync_time(1_000_000, c) == pytest.approx(outer)
    t10 = pm.sync_step_time(wl, c, k, sync_every=10)
    assert t10 == pytest.approx(inner + outer / 10)
    assert pm.sync_step_time(wl, c, k, sync_every=40) < t10 < pm.step_time("dense", wl, 1.0, c, k)
    # streaming: F fragments of P/F every H/F steps; a delay of one inner step hides them
    frag = pm.outer_sync_time(500_000, c)
    assert pm.sync_step_time(wl, c, k, 10, fragments=2) == pytest.approx(inner + 2 * frag / 10)
    hidden = pm.sync_step_time(wl, c, k, 10, fragments=2, delay=1)
    assert hidden == pytest.approx(inner + 2 * max(0.0, frag - inner) / 10)
    assert pm.outer_sync_time(1e6, pm.Cluster(1, 8, 1e9)) == 0.0
    with pytest.raises(ValueError):
        pm.sync_step_time(wl, c, k, 0)
