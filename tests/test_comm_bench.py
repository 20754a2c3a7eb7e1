"""The ``topk`` and ``comm`` benchmarks run (quick sizes) and write their CSV columns and PNG."""

from __future__ import annotations

import pandas as pd
import pytest

from bench.benchmarks import load_all


def test_topk_benchmark_quick(tmp_path) -> None:
    path = load_all().get("topk").run(results_dir=str(tmp_path), quick=True)
    df = pd.read_csv(path)
    for col in (
        "method",
        "input",
        "numel",
        "density",
        "k",
        "median_ms",
        "hardware",
        "coverage",
        "speedup_vs_topk",
        "x_floor",
    ):
        assert col in df.columns, col
    assert {"sum", "torch.topk", "mstopk-tiled", "mstopk-paper", "mstopk+ef"} <= set(df["method"])
    exact = df[df["method"].isin(["mstopk-tiled", "mstopk-sampled", "mstopk-hist"])]
    assert (exact["coverage"] > 0.9999).all()
    assert (df["median_ms"] > 0).all()
    assert (tmp_path / "bench" / "topk.png").exists()


@pytest.mark.slow  # 35 s: the whole benchmark; the hooks' bytes are tested in test_comm_*
def test_comm_benchmark_quick(tmp_path) -> None:
    path = load_all().get("comm").run(results_dir=str(tmp_path), quick=True)
    df = pd.read_csv(path)
    for col in (
        "method",
        "density",
        "median_ms",
        "hardware",
        "bytes_per_worker",
        "inter_node_bytes_per_worker",
        "inter_bytes_ratio_vs_dense",
        "nnodes",
    ):
        assert col in df.columns, col
    agg = df[df["kind"] == "aggregation"]
    assert set(agg["method"]) == {"dense", "fp16", "topk", "hitopk"}
    by = agg.set_index("method")
    assert by.loc["fp16", "bytes_per_worker"] == by.loc["dense", "bytes_per_worker"] / 2
    assert (
        by.loc["hitopk", "inter_node_bytes_per_worker"]
        < by.loc["topk", "inter_node_bytes_per_worker"]
    )
    # each node's link: hitopk sends fewer bytes than the flat allgather
    assert by.loc["hitopk", "link_bytes_per_node"] < by.loc["topk", "link_bytes_per_node"]
    ov = df[df["kind"] == "overlap"]
    assert set(ov["method"]) == {"dense", "hitopk"}
    for col in ("step_ms", "backward_ms", "comm_alone_ms"):
        assert (ov[col] > 0).all(), col
    assert (ov["exposed_ms"] == ov["step_ms"] - ov["backward_ms"]).all()
    assert (tmp_path / "bench" / "comm.png").exists()


def test_overlap_case_takes_ddp_bucket_size() -> None:
    from bench.benchmarks.overlap import overlap_worker
    from bench.benchmarks.spawn import run_workers

    rows = run_workers(overlap_worker, 2, 2, ["dense"], 0.01, 2, 16, 1, 1, 25.0)[0]
    small = run_workers(overlap_worker, 2, 2, ["dense"], 0.01, 2, 16, 1, 1, 2.0)[0]
    assert rows[0]["bucket_cap_mb"] == 25.0 and small[0]["bucket_cap_mb"] == 2.0
    # ResNet-18's 44.7 MB of fp32 gradients: DDP's buckets follow the cap
    assert small[0]["buckets"] > rows[0]["buckets"] >= 2
    assert small[0]["comm_alone_ms"] > 0 and small[0]["backward_ms"] > 0
