"""The ``input`` benchmark in quick mode writes the documented CSV columns and a PNG."""

from __future__ import annotations

import pandas as pd


def test_input_benchmark_quick(tmp_path) -> None:
    from bench.benchmarks.input import run

    path = run(str(tmp_path), quick=True)
    df = pd.read_csv(path)
    for col in ("loader", "cache", "throttled", "epoch", "images_per_s", "median_ms", "hardware",
                "speedup_vs_none", "dali_vs_torch", "hits", "misses"):
        assert col in df.columns
    assert set(df["cache"]) == {"none", "multilevel", "predecoded"}
    assert set(df["throttled"]) == {True, False}
    assert (df["images_per_s"] > 0).all() and (df["images"] > 0).all()
    cached = df[(df["cache"] == "multilevel") & (df["epoch"] == 2)]
    assert (cached["misses"] == 0).all() and (cached["hits"] > 0).all()  # epoch 2 served from cache
    assert (tmp_path / "bench" / "input.png").stat().st_size > 0
    try:
        import nvidia.dali  # noqa: F401

        assert set(df["loader"]) == {"torch", "dali"}
    except ImportError:  # DALI is optional: the benchmark measures torch alone
        assert set(df["loader"]) == {"torch"}
