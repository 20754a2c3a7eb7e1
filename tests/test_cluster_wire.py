"""Bytes on the emulated cluster's links, read from the interfaces' counters, against the
cost function's prediction with TCP/IP framing (root)."""

import json
import os
import shutil
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("tc"), reason="needs root and iproute2")
def test_measured_link_bytes_match_the_cost_function(tmp_path: Path):
    from bench.benchmarks.cluster import _wire
    from bench.cluster.emulated import run_nodes
    from bench.cluster.netns import EmulatedCluster

    out = tmp_path / "agg.json"
    args = ["--out", str(out), "--numel", "4000000", "--density", "0.01", "--bucket-mb", "4"]
    args += [
        "--reps",
        "2",
        "--warmup",
        "0",
        "--calib-mb",
        "",
        "--comms",
        "dense,topk,mstopk,hitopk",
    ]
    with EmulatedCluster(2, 1e9, 0.0) as c:
        rc = run_nodes(c, 2, "bench.benchmarks.aggbench", args, rdzv_timeout_s=120, timeout_s=300)
    assert rc == 0
    res = json.loads(out.read_text())
    for comm in ("dense", "topk", "mstopk", "hitopk"):
        w = _wire(comm, res)
        assert w["wire_bytes_per_node"] > 0.9 * w["link_bytes_per_node"], comm
        assert abs(w["wire_error"]) < 0.10, (comm, w)
