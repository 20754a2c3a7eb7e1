"""The alpha-beta model (bench.cluster.perfmodel) on hand-computed cases."""

import math

import pytest

from bench.cluster import perfmodel as pm


def test_ring_allreduce_across_nodes_uses_the_slow_link():
    c = pm.Cluster(nodes=2, procs_per_node=2, inter_bw=1000.0, inter_lat=0.01, intra_bw=1e9)
    # 2 (w-1)/w * d b / B = 2*3/4 * 4000 / 1000 = 6.0 s; 2 (w-1) alpha = 0.06 s
    assert pm.ring_allreduce(1000, c, pm.Costs()) == pytest.approx(6.06)


def test_ring_allreduce_inside_one_node_uses_the_fast_link():
    c = pm.Cluster(nodes=1, procs_per_node=4, inter_bw=1.0, intra_bw=2000.0, intra_lat=0.0)
    assert pm.ring_allreduce(1000, c, pm.Costs()) == pytest.approx(3.0)
    assert pm.ring_allreduce(1000, pm.Cluster(1, 1, 1.0), pm.Costs()) == 0.0


def test_flat_topk_allgather():
    c = pm.Cluster(nodes=2, procs_per_node=2, inter_bw=800.0, inter_lat=0.1)
    k = pm.Costs(select_s=1e-4, scatter_s=1e-3)
    # k = 100 pairs of 8 B: 3 ring steps of (800/800 + 0.1) = 3.3 s; select 10000 * 1e-4 = 1 s;
    # scatter 4 * 100 pairs * 1e-3 = 0.4 s
    assert pm.topk_allgather(10_000, 0.01, c, k) == pytest.approx(4.7)


def test_hitopk_phases():
    c = pm.Cluster(
        nodes=2, procs_per_node=2, inter_bw=800.0, inter_lat=0.1, intra_bw=4000.0, intra_lat=0.0
    )
    # reduce-scatter 1/2 * 40000 / 4000 = 5.0; shard 5000, k_s = 50 pairs = 400 B;
    # inter allgather over the link shared by 2 workers: 400 / 400 + 0.1 = 1.1;
    # intra allgather of 2 * 400 B: 800 / 4000 = 0.2
    assert pm.hitopk(10_000, 0.01, c, pm.Costs()) == pytest.approx(6.3)


def test_hitopk_beats_dense_on_a_slow_link_and_small_buckets_go_dense():
    c = pm.Cluster(nodes=16, procs_per_node=8, inter_bw=25e9 / 8, inter_lat=50e-6)
    b = pm.buckets_for(pm.RESNET50_NUMEL)
    dense = pm.aggregation_time("dense", b, 0.001, c, pm.PAPER_COSTS)
    hi = pm.aggregation_time("hitopk", b, 0.001, c, pm.PAPER_COSTS)
    assert hi < dense / 5
    # a bucket below min_numel is allreduced densely whatever the comm
    assert pm.aggregation_time("hitopk", [1000], 0.001, c, pm.Costs()) == pytest.approx(
        pm.ring_allreduce(1000, c, pm.Costs())
    )
    with pytest.raises(ValueError):
        pm.aggregation_time("nope", b, 0.001, c, pm.Costs())


def test_buckets_and_step_time_with_overlap():
    assert pm.buckets_for(10, bucket_cap_mb=16 / 2**20) == (4, 4, 2)
    assert sum(pm.buckets_for(pm.RESNET50_NUMEL)) == pm.RESNET50_NUMEL
    wl = pm.Workload(buckets=(1000,), compute_s=1.0, overlap=0.5)  # hides 1/3 s
    c = pm.Cluster(nodes=2, procs_per_node=1, inter_bw=2000.0)  # dense: 2*1/2*4000/2000 = 2 s
    assert pm.step_time("dense", wl, 1.0, c, pm.Costs()) == pytest.approx(1.0 + 2.0 - 1 / 3)
    assert pm.scaling_efficiency("dense", wl, 1.0, c, pm.Costs()) == pytest.approx(1 / (8 / 3))


def test_fit_alpha_beta_and_calibrate():
    sizes = [1e3, 1e4, 1e5]
    alpha, bw = pm.fit_alpha_beta(sizes, [1e-3 + s / 1e6 for s in sizes])
    assert alpha == pytest.approx(1e-3) and bw == pytest.approx(1e6)
    with pytest.raises(ValueError):
        pm.fit_alpha_beta([1.0], [1.0])
    meas = pm.Measurements(
        inter_bw=125e6,
        inter_lat=1e-4,
        # m = 2: a ring allreduce moves 2 (m-1)/m s = s bytes: t = 2e-3 + s / 1e9
        intra_allreduce=[(1e6, 2e-3 + 1e-3), (4e6, 2e-3 + 4e-3)],
        select=[(1000, 1e-3), (3000, 3e-3)],
        # m = 2 moves half the input: 1e6 of 2e6 bytes in 2e-3 s minus the 1e-3 s latency
        intra_reduce_scatter=[(2e6, 2e-3)],
    )
    c, k = pm.calibrate(pm.Cluster(2, 2, inter_bw=1.0), pm.Costs(), meas)
    assert c.inter_bw == 125e6 and c.inter_lat == 1e-4
    assert c.intra_bw == pytest.approx(1e9) and c.intra_lat == pytest.approx(1e-3)
    assert k.select_s == pytest.approx(1e-6) and k.scatter_s == 0.0
    assert c.intra_rs_bw == pytest.approx(1e9)


def test_projection_covers_the_paper_cluster():
    rows = pm.project(gbps=(25, 400), nodes=(1, 16))
    assert len(rows) == 2 * 2 * 3
    for r in rows:
        assert 0 < r["efficiency"] <= 1 + 1e-9 and math.isfinite(r["step_ms"])
    eff = {(r["gbps"], r["nodes"], r["comm"]): r["efficiency"] for r in rows}
    assert eff[(25, 16, "hitopk")] > eff[(25, 16, "dense")]
    assert eff[(400, 16, "dense")] > eff[(25, 16, "dense")]
