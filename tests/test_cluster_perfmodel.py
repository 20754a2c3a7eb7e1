"""The alpha-beta model (bench.cluster.perfmodel) and its projection on hand-computed cases."""

import math

import pytest

from bench import methods as M
from bench.cluster import perfmodel as pm
from bench.cluster import projection
from bench.registry import ConfigError


def _agg(name, buckets, density, c, k, shapes=None, rank=4):
    """A method's aggregation time of ``buckets`` (its spec's price)."""
    s = M.get(name)
    kn = s.knobs_of({"comm.density": density, "comm.powersgd_rank": rank})
    return s.aggregation_time(buckets, c, k, kn, shapes)


def _step(name, wl, c, k):
    return M.get(name).step_time(wl, c, k, M.get(name).knobs_of({}))


def test_ring_allreduce_across_nodes_uses_the_slow_link():
    c = pm.Cluster(nodes=2, procs_per_node=2, inter_bw=1000.0, inter_lat=0.01, intra_bw=1e9)
    # 2 (w-1)/w * d b / B = 2*3/4 * 4000 / 1000 = 6.0 s; 2 (w-1) alpha = 0.06 s
    assert pm.ring_allreduce(1000, c, pm.Costs()) == pytest.approx(6.06)


def test_ring_allreduce_inside_one_node_uses_the_fast_link():
    c = pm.Cluster(nodes=1, procs_per_node=4, inter_bw=1.0, intra_bw=2000.0, intra_lat=0.0)
    assert pm.ring_allreduce(1000, c, pm.Costs()) == pytest.approx(3.0)
    assert pm.ring_allreduce(1000, pm.Cluster(1, 1, 1.0), pm.Costs()) == 0.0


def test_nccl_allreduce_is_hierarchical():
    c = pm.Cluster(
        nodes=4, procs_per_node=2, inter_bw=1000.0, inter_lat=0.01, intra_bw=4000.0, intra_lat=0
    )
    # shard 2000 B; intra reduce-scatter and allgather 2000 B each at 4000 B/s: 1.0 s;
    # inter ring of the shards: 2 * 3/4 * 2000 B per worker, both workers on one link:
    # 6000 B / 1000 B/s = 6 s, plus 2 (n-1) = 6 latencies of 0.01 s
    assert pm.nccl_allreduce(1000, c, pm.Costs()) == pytest.approx(7.06)
    # a flat ring pays 2 (w-1) = 14 inter-node latencies instead of 6
    assert pm.ring_allreduce(1000, c, pm.Costs()) == pytest.approx(2 * 7 / 8 * 4 + 0.14)


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
    # inter allgather: both workers of a node send 400 B over its link: 800 / 800 + 0.1 = 1.1;
    # intra allgather of 2 * 400 B: 800 / 4000 = 0.2
    assert pm.hitopk(10_000, 0.01, c, pm.Costs()) == pytest.approx(6.3)


def test_hitopk_beats_dense_on_a_slow_link_and_small_buckets_go_dense():
    c = projection.paper_cluster(16, 25, 0.7)
    b = pm.buckets_for(pm.RESNET50_NUMEL)
    dense = _agg("dense", b, 0.001, c, projection.GPU_COSTS)
    hi = _agg("hitopk", b, 0.001, c, projection.GPU_COSTS)
    assert hi < dense / 5
    assert _agg("hitopk", [1000], 0.001, c, pm.Costs()) == pytest.approx(
        pm.nccl_allreduce(1000, c, pm.Costs())
    )
    with pytest.raises(ConfigError):
        _agg("nope", b, 0.001, c, pm.Costs())


def test_step_time_hides_by_measured_share_but_never_the_last_bucket():
    c = pm.Cluster(nodes=2, procs_per_node=1, inter_bw=2000.0)  # 1000 el: 2*1/2*4000/2000 = 2 s
    wl = pm.Workload(buckets=(1000, 1000), compute_s=3.0, hidden={"dense": 0.5})
    # 4 s of aggregation, half hidden = 2 s exposed; the last bucket alone is 2 s
    assert _step("dense", wl, c, pm.Costs()) == pytest.approx(3.0 + 2.0)
    wl = pm.Workload(buckets=(100, 1000), compute_s=3.0, hidden={"dense": 0.9})
    # 2.2 s in all, 10 % = 0.22 s; but the last bucket's 2 s cannot hide
    assert _step("dense", wl, c, pm.Costs()) == pytest.approx(5.0)
    wl = pm.Workload(buckets=(1000, 100), compute_s=0.3, hidden={"dense": 1.0})
    # backward is 0.2 s: at most 0.2 of the 2.2 s hide
    assert _step("dense", wl, c, pm.Costs()) == pytest.approx(0.3 + 2.0)
    # no measurement for a method: nothing hidden
    assert _step("dense", pm.Workload((1000,), 9.0), c, pm.Costs()) == 9.0 + 2.0


def test_fit_alpha_beta_and_calibrate_from_micro_measurements():
    sizes = [1e3, 1e4, 1e5]
    alpha, bw = pm.fit_alpha_beta(sizes, [1e-3 + s / 1e6 for s in sizes])
    assert alpha == pytest.approx(1e-3) and bw == pytest.approx(1e6)
    with pytest.raises(ValueError):
        pm.fit_alpha_beta([1.0], [1.0])
    meas = pm.Measurements(
        inter_bw=125e6,  # link check: replaced by the ring shift
        inter_lat=1e-4,
        ring_shift=[(1e6, 2e-3 + 1e-2), (4e6, 2e-3 + 4e-2)],
        intra_shift=[(1e6, 1e-3 + 1e-3), (4e6, 1e-3 + 4e-3)],
        select=[(1000, 1e-3), (3000, 3e-3)],
        reduce=[(1000, 2e-6)],
    )
    c, k = pm.calibrate(pm.Cluster(2, 2, inter_bw=1.0), pm.Costs(), meas)
    assert c.inter_bw == pytest.approx(1e8) and c.inter_lat == pytest.approx(2e-3)
    assert c.intra_bw == pytest.approx(1e9) and c.intra_lat == pytest.approx(1e-3)
    assert k.select_s == pytest.approx(1e-6) and k.reduce_s == pytest.approx(2e-9)
    assert k.scatter_s == 0.0
    c, _ = pm.calibrate(pm.Cluster(2, 2, 1.0), pm.Costs(), pm.Measurements(inter_bw=125e6))
    assert c.inter_bw == 125e6


def test_projection_has_bands_and_sources():
    hooks = M.specs(kind="hook")
    rows = projection.project(hooks, {"hitopk": 0.5}, gbps=(25, 400), nodes=(1, 16))
    assert len(rows) == 2 * 2 * len(hooks)
    for r in rows:
        assert 0 < r["efficiency_min"] <= r["efficiency"] <= r["efficiency_max"] <= 1 + 1e-9
        assert math.isfinite(r["step_ms"])
    eff = {(r["gbps"], r["nodes"], r["comm"]): r for r in rows}
    assert eff[(25, 16, "hitopk")]["efficiency"] > eff[(25, 16, "dense")]["efficiency"]
    # the last bucket cannot hide: no method reaches 100 % on 16 nodes
    assert eff[(25, 16, "hitopk")]["efficiency_max"] < 1
    assert eff[(25, 16, "hitopk")]["efficiency_min"] < eff[(25, 16, "hitopk")]["efficiency_max"]
    assert all(a.source for a in projection.ASSUMPTIONS.values())
    assert "NVIDIA DeepLearningExamples" in projection.describe()


def test_the_projection_carries_2020s_dense_baselines_and_powersgd():
    rows = projection.project(M.specs(kind="hook"), gbps=(25,), nodes=(16,))
    by = {r["comm"]: r for r in rows}
    assert {"dense", "fp16", "powersgd", "hitopk"} <= set(by)
    # fp16 on the wire halves the bytes: faster than fp32 dense on a slow link
    assert by["fp16"]["step_ms"] < by["dense"]["step_ms"]
    # no overlap measured on V100s: the assumption, with a band from nothing hidden
    assert all(r["hidden_source"] == "assumed" for r in rows)
    assert by["fp16"]["hidden"] == projection.ASSUMPTIONS["hidden"].value
    assert by["fp16"]["efficiency_min"] < by["fp16"]["efficiency"]
    measured = projection.project([M.get("fp16")], {"fp16": 0.0}, gbps=(25,), nodes=(16,))
    assert measured[0]["hidden_source"] == "measured"
    assert measured[0]["efficiency"] < by["fp16"]["efficiency"]


def test_fp16_and_powersgd_bucket_times():
    c = projection.paper_cluster(16, 25, 0.7)
    k = pm.Costs()  # transfers only
    d = 1_000_000
    half = _agg("fp16", [d], 1.0, c, k)
    full = _agg("dense", [d], 1.0, c, k)
    lat = _agg("dense", [1], 1.0, c, k)  # the latency terms alone
    assert half - lat == pytest.approx((full - lat) / 2, rel=1e-3)
    # PowerSGD: a 1000 x 1000 matrix at rank 4 sends 8,000 elements (P and Q)
    psgd = _agg("powersgd", [d], 1.0, c, k, shapes=[[(1000, 1000)]], rank=4)
    expect = 2 * pm.nccl_allreduce(4000, c, k)
    assert psgd == pytest.approx(expect)
    # without shapes nothing is compressed: a plain fp32 allreduce
    assert _agg("powersgd", [d], 1.0, c, k) == pytest.approx(full)


def test_resnet50_buckets_follow_ddp():
    numel, shapes = projection.model_buckets("resnet50")
    assert sum(numel) == pm.RESNET50_NUMEL and len(shapes) == len(numel) > 2
    # the last parameter (the classifier's bias) is reduced first
    assert shapes[0][0] == (1000,)
