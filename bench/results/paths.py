"""Where benchmark results live: ``<results>/bench/<name>.csv``, its figure beside it."""

from __future__ import annotations

from pathlib import Path

RUNS_DIR = "runs"  # the default results directory (git-ignored; results.dir)
BENCH_DIR = "bench"  # under the results directory


def bench_dir(results_dir: str | Path) -> Path:
    return Path(results_dir) / BENCH_DIR


def bench_csv(results_dir: str | Path, name: str) -> Path:
    return bench_dir(results_dir) / f"{name}.csv"


def bench_png(results_dir: str | Path, name: str) -> Path:
    return bench_dir(results_dir) / f"{name}.png"
