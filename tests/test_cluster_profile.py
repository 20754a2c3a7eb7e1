"""The ``paper`` cluster profile: the paper's communication/compute ratio, and the emulated
bandwidth that keeps it on this machine."""

import pytest
import torch

from bench.cluster import perfmodel as pm
from bench.cluster import profile, projection
from bench.registry import ConfigError


def test_paper_ratio_is_dense_time_over_v100_compute():
    c = projection.paper_cluster(16, 25.0, 0.7)
    dense = pm.aggregation_time(
        "dense", pm.buckets_for(pm.RESNET50_NUMEL), 1.0, c, projection.GPU_COSTS
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
    assert profile.resolve(None, net, batch, 27, 2, 2) is None
    r = profile.resolve("paper", net, batch, 27, 2, 2)
    assert r["compute_s"] > 0 and r["target_ratio"] > 0
    assert r["inter_node_bandwidth"].endswith("mbit")
    with pytest.raises(ConfigError, match="unknown cluster profile"):
        profile.resolve("nope", net, batch, 27, 2, 2)
