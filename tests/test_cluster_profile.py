"""The ``paper`` cluster profile: the paper's communication/compute ratio, and the emulated
bandwidth that keeps it on this machine."""

import pytest
import torch

from bench import methods as M
from bench.cluster import perfmodel as pm
from bench.cluster import projection
from bench.launch import profile
from bench.models import build_model
from bench.registry import ConfigError


def test_paper_ratio_is_dense_time_over_v100_compute():
    c = projection.paper_cluster(16, 25.0, 0.7)
    dense = M.get("dense").aggregation_time(
        pm.buckets_for(pm.RESNET50_NUMEL), c, projection.GPU_COSTS, M.get("dense").knobs_of({})
    )
    # 102 MB over 25 Gbit/s at 70 %: about 2 * 15/16 * 102 MB / 2.19 GB/s = 87 ms of link
    assert 0.08 < dense < 0.12
    assert profile.paper_ratio(compute_s=0.1) == pytest.approx(dense / 0.1)


def test_bandwidth_for_ratio_sends_the_link_bytes_in_ratio_times_compute():
    # 2 x 2, 1 M elements: 2 * 3/4 * 4 MB = 6 MB over each link; ratio 0.5 of 0.48 s = 0.24 s
    bps = profile.bandwidth_for_ratio(0.5, 0.48, 1_000_000, 2, 2)
    assert bps == pytest.approx(6e6 * 8 / 0.24)
    with pytest.raises(ConfigError):
        profile.bandwidth_for_ratio(0.0, 1.0, 10, 2, 2)


def test_resolve_measures_compute_and_refuses_unknown_profiles():
    net = torch.nn.Linear(8, 3)
    batch = (torch.randn(4, 8), torch.randint(3, (4,)))
    compute = profile.measure_compute_s(net, batch)
    assert profile.resolve(None, compute, 27, 2, 2) is None
    r = profile.resolve("paper", compute, 27, 2, 2)
    assert r["compute_s"] > 0 and r["target_ratio"] > 0
    assert r["inter_node_bandwidth"].endswith("mbit")
    with pytest.raises(ConfigError, match="unknown cluster profile"):
        profile.resolve("nope", compute, 27, 2, 2)


def _cfg(*overrides: str):
    from bench.config import to_object
    from bench.sweeps.common import compose

    return to_object(compose(["experiment=dawnbench_digits", "cluster=emulated", *overrides]))


def test_a_profile_needs_the_emulated_cluster_and_a_known_name():
    from bench.launch.run import validate

    cfg = _cfg("cluster.profile=paper")
    cfg.cluster.name = "local"
    with pytest.raises(ConfigError, match="no link to shape"):
        validate(cfg)
    with pytest.raises(ConfigError, match="unknown cluster profile 'fast'"):
        profile.check("fast")
    bad = _cfg("cluster.profile=paper", "cluster.profile_compute_s=-1")
    with pytest.raises(ConfigError, match="profile_compute_s must be > 0"):
        profile.apply(bad)


def test_host_contention_counts_every_emulated_worker_on_this_host():
    assert pm.host_contention(2, 2, 1, 2) == 2.0  # 4 one-thread workers, 2 cores
    assert pm.host_contention(1, 2, 1, 2) == 1.0
    assert pm.host_contention(2, 2, 4, 16) == 1.0  # never below 1


def test_apply_times_this_host_and_sets_the_link():
    cfg = _cfg("cluster.profile=paper")
    assert profile.apply(_cfg()) is None  # no profile: the configured link is kept
    p = profile.apply(cfg)
    assert p["compute_measured_here"] and p["compute_alone_s"] > 0
    assert p["compute_s"] == pytest.approx(p["compute_alone_s"] * p["contention"])
    n = sum(q.numel() for q in build_model(cfg.model, 10, 3).parameters())
    assert p["numel"] == n  # the model the run trains (digits: 10 classes, as RGB)
    assert cfg.cluster.inter_node_bandwidth == p["inter_node_bandwidth"]
    # the chosen link sends a dense step's link bytes in the paper's ratio x compute time
    expect = profile.bandwidth_for_ratio(p["target_ratio"], p["compute_s"], n, 2, 2)
    assert p["bandwidth_bps"] == pytest.approx(expect)


def test_a_given_compute_time_is_not_timed_again_and_halves_the_link_when_doubled():
    one = profile.apply(_cfg("cluster.profile=paper", "cluster.profile_compute_s=0.2"))
    two = profile.apply(_cfg("cluster.profile=paper", "cluster.profile_compute_s=0.4"))
    assert not one["compute_measured_here"] and one["compute_s"] == 0.2
    assert one["bandwidth_bps"] == pytest.approx(2 * two["bandwidth_bps"])
    assert "as given" in profile.describe(one)


def test_a_sweep_times_once_and_pins_the_compute_time_for_every_run():
    from bench.sweeps.common import pin_profile
    from tests.helpers.sweeps import pin_link

    job = ["experiment=dawnbench_digits", "cluster=emulated", "cluster.profile=paper"]
    pinned, note = pin_profile(job)
    assert len(pinned) == 1 and pinned[0].startswith("cluster.profile_compute_s=")
    assert float(pinned[0].split("=")[1]) > 0 and "once for the sweep" in note
    assert pin_profile([*job, *pinned]) == ([], "")  # already pinned: not timed again
    link, note = pin_link([*job, *pinned])
    assert link[0] == "cluster.profile=null" and link[1].endswith("mbit") and "2x2" in note


def test_the_record_keeps_the_profile(tmp_path):
    from bench.config import to_container
    from bench.results.records import RunRecord

    cfg = _cfg("cluster.profile=paper", "cluster.profile_compute_s=0.3")
    p = profile.apply(cfg)
    meta = {"run_id": "r", "started_at": "now", "launch_time": 0.0, "cluster_profile": p}
    rec = RunRecord.start(cfg, meta, config=to_container(cfg), comm_sparse=False)
    assert rec.cluster_profile == p
    assert rec.config["cluster"]["inter_node_bandwidth"] == p["inter_node_bandwidth"]


def test_each_named_setting_derives_its_ratio_from_its_inputs():
    d = {name: profile.derive(name) for name in profile.PROFILES}
    assert {"paper", "paper-b64", "paper-224", "paper-fp16"} <= set(d)
    for r in d.values():
        # the ratio is the model's dense time over the V100's compute, with a NIC band
        assert r["ratio"] == pytest.approx(r["dense_s"] / r["compute_s"])
        assert r["ratio_low"] < r["ratio"] < r["ratio_high"]
        assert "DeepLearningExamples" in r["compute_source"] and r["setting_source"]
    # 1,156 img/s at 224 px: 256 images take 0.221 s, a quarter of them a quarter of that
    assert d["paper-224"]["compute_s"] == pytest.approx(256 / 1156)
    assert d["paper-b64"]["compute_s"] == pytest.approx(d["paper"]["compute_s"] / 4)
    assert d["paper"]["compute_s"] == pytest.approx(256 / 1156 * (128 / 224) ** 2)
    # the settings span the paper's: 64 per GPU about 4x, 224 px about 1/3, fp16 about 1/2
    assert d["paper-b64"]["ratio"] == pytest.approx(4 * d["paper"]["ratio"])
    assert d["paper-224"]["ratio"] < 0.5 < d["paper"]["ratio"] < d["paper-b64"]["ratio"]
    assert 0.5 < d["paper-fp16"]["ratio"] / d["paper"]["ratio"] < 0.6  # latency stays
    assert d["paper-fp16"]["flat_ring_link_bytes"] == d["paper"]["flat_ring_link_bytes"] / 2


def test_fp16_on_the_wire_is_the_same_link_as_fp32():
    # the same cluster: the fp16 profile's lower ratio comes from its half-size elements
    compute = 0.5
    fp32 = profile.resolve("paper", compute, 1_000_000, 2, 2)
    fp16 = profile.resolve("paper-fp16", compute, 1_000_000, 2, 2)
    b32, b16 = fp32["bandwidth_bps"], fp16["bandwidth_bps"]
    ratio = fp16["target_ratio"] / fp32["target_ratio"]
    assert b16 == pytest.approx(b32 * 0.5 / ratio)  # halved bytes over a lower ratio
    assert fp16["derivation"]["wire_bytes"] == 2
