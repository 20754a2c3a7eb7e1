"""The ``input_gpu`` benchmark in quick mode: one row per case with images/s and the ratio
to torchvision measured in the same run; cases that cannot run here (no CUDA, no DALI)
get a row saying why, and torchvision is measured regardless."""

from __future__ import annotations

import math

import pandas as pd
import torch


def test_input_gpu_benchmark_quick(tmp_path) -> None:
    from bench.benchmarks.harness import have_dali
    from bench.benchmarks.input_gpu import CASES, run

    df = pd.read_csv(run(str(tmp_path), quick=True)).set_index("case")
    assert list(df.index) == list(CASES)
    for col in ("images_per_s", "vs_torchvision", "median_ms", "iqr_ms", "device", "skipped",
                "hardware", "git_sha", "date", "images", "batch", "reps"):  # fmt: skip
        assert col in df.columns
    tv = df.loc["torchvision"]
    assert tv["images_per_s"] > 0 and tv["vs_torchvision"] == 1.0 and tv["images"] == 64
    assert math.isclose(tv["images_per_s"], 64 / (tv["median_ms"] / 1e3), rel_tol=1e-2)
    skipped = df["skipped"].fillna("")
    cuda, dali = torch.cuda.is_available(), have_dali()
    assert (skipped["dali_mixed"] == "") == (cuda and dali)
    for case in ("dali_cpu", "dali_predecoded"):
        assert (skipped[case] == "") == dali
    for case in df.index[skipped == ""]:
        r = df.loc[case]
        ratio = r["images_per_s"] / tv["images_per_s"]
        assert math.isclose(r["vs_torchvision"], ratio, rel_tol=1e-2)
    if dali:
        assert df.loc["dali_cpu", "device"] == "cpu"
        assert df.loc["dali_predecoded", "device"] == ("gpu" if cuda else "cpu")
    assert (tmp_path / "bench" / "input_gpu.png").stat().st_size > 0


def test_input_gpu_without_dali_measures_torchvision_alone() -> None:
    """As on a machine without NVIDIA DALI: the DALI rows say so, torchvision is measured."""
    from bench.benchmarks.input_gpu import measure

    rows = {r["case"]: r for r in measure(quick=True, dali=False)}
    assert rows["torchvision"]["images_per_s"] > 0
    for case in ("dali_mixed", "dali_cpu", "dali_predecoded"):
        assert rows[case]["skipped"] == "NVIDIA DALI is not installed"
        assert "images_per_s" not in rows[case] and math.isnan(rows[case]["vs_torchvision"])
