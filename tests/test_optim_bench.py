"""The ``update`` benchmark runs (quick sizes) and writes its CSV columns and PNG."""

from __future__ import annotations

import pandas as pd

from bench.benchmarks import load_all


def test_update_benchmark_quick(tmp_path) -> None:
    path = load_all().get("update").run(results_dir=str(tmp_path), quick=True)
    df = pd.read_csv(path)
    for col in (
        "model",
        "optimizer",
        "mode",
        "median_ms",
        "hardware",
        "floor_ms",
        "floor_ratio",
        "speedup_vs_naive",
        "zero_grad_ms",
        "n_tensors",
        "n_values",
        "ddp_copies",
        "ddp_copy_ms",
        "total_ms",
        "total_vs_fused",
    ):
        assert col in df.columns, col
    assert set(df["mode"]) == {"naive", "foreach", "fused", "flat"}
    assert set(df["optimizer"]) == {"sgd", "lars", "adamw"}
    assert not ((df["optimizer"] == "lars") & (df["mode"] == "fused")).any()
    assert (df["median_ms"] > 0).all()
    # gradients in DDP-like buckets: the flat update copies none of them
    assert (df.loc[df["mode"] == "flat", "ddp_copies"] == 0).all()
    assert (df["total_ms"] >= df["median_ms"]).all()
    fused = df[(df["mode"] == "fused") & (df["variant"].isna())]
    assert (fused["total_vs_fused"] == 1.0).all()
    masters = df[df["variant"] == "master=bf16"]
    assert set(masters["optimizer"]) == {"sgd", "lars", "adamw"}
    assert (tmp_path / "bench" / "update.png").exists()
