"""Where benchmark results live under a results directory: ``<results>/bench/<name>.csv``
(append-only rows, :class:`bench.benchmarks.harness.BenchRun`) and its figure beside it.

Run records, curves, MLPerf logs and the event log keep their paths next to their one
writer (:mod:`bench.results.records`, :mod:`bench.results.mllog`,
:mod:`bench.results.events`).
"""

from __future__ import annotations

from pathlib import Path

BENCH_DIR = "bench"  # under the results directory


def bench_dir(results_dir: str | Path) -> Path:
    return Path(results_dir) / BENCH_DIR


def bench_csv(results_dir: str | Path, name: str) -> Path:
    """The rows of benchmark ``name``, every run of it on every machine."""
    return bench_dir(results_dir) / f"{name}.csv"


def bench_png(results_dir: str | Path, name: str) -> Path:
    """The figure of benchmark ``name``'s newest run, drawn beside its CSV."""
    return bench_dir(results_dir) / f"{name}.png"
