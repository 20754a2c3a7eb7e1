"""The ``input`` benchmark in quick mode writes the documented CSV columns and a PNG, and
its cases are like for like: the same images per epoch and the same read concurrency."""

from __future__ import annotations

import pandas as pd


def test_input_benchmark_quick(tmp_path) -> None:
    from bench.benchmarks.input import run

    path = run(str(tmp_path), quick=True)
    df = pd.read_csv(path)
    for col in ("loader", "cache", "throttled", "epoch", "images_per_s", "median_ms", "hardware",
                "speedup_vs_none", "dali_vs_torch", "hits", "misses", "mb_decoded", "processes",
                "threads", "reads_outstanding", "resident_pct", "load_1m"):  # fmt: skip
        assert col in df.columns
    assert set(df["cache"]) == {"none", "multilevel", "predecoded"}
    assert set(df["throttled"]) == {True, False}
    assert (df["images_per_s"] > 0).all() and (df["images"] > 0).all()
    assert df["images"].nunique() == 1  # every case reads the same images per epoch
    assert df["reads_outstanding"].nunique() == 1  # ... with the same read concurrency
    cached = df[(df["cache"] == "multilevel") & (df["epoch"] == 2)]
    assert (cached["misses"] == 0).all() and (cached["hits"] > 0).all()  # epoch 2 served from cache
    pre = df[df["cache"] == "predecoded"]
    assert (pre[pre["epoch"] == 1]["mb_decoded"] > 0).all()  # the memory cost is recorded
    assert (tmp_path / "bench" / "input.png").stat().st_size > 0
    try:
        import nvidia.dali  # noqa: F401

        assert set(df["loader"]) == {"torch", "dali"}
    except ImportError:  # DALI is optional: the benchmark measures torch alone
        assert set(df["loader"]) == {"torch"}


def test_upsampled_share() -> None:
    """Crops of a 1000 x 1000 image are rarely enlarged to 224; of a 256 x 256 one, mostly."""
    from bench.benchmarks.input import upsampled_share

    assert upsampled_share([(1000, 1000)], draws=200) < 0.1
    assert upsampled_share([(256, 256)], draws=200) > 0.6
