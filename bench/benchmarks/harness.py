"""Shared benchmark harness: careful timing and append-only CSV results.

Timing: warm-up calls are discarded, then ``reps`` timed calls; CUDA work is
synchronised around each call.  The median is reported (ms) with the min and the
inter-quartile range.  Rows are appended to ``<results>/bench/<name>.csv`` with the
hardware, versions, date and git sha of the run, so that older measurements (on other
machines too) are kept and a plot can pick the newest run per hardware.
"""

from __future__ import annotations

import datetime as _dt
import statistics
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from filelock import FileLock

from bench.results.env import git_sha, hardware, versions


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def measure(fn: Callable[[], Any], *, warmup: int = 2, reps: int = 7) -> dict[str, float]:
    """Time ``fn()``: median/min/IQR in milliseconds over ``reps`` calls after warm-up."""
    for _ in range(warmup):
        fn()
    _sync()
    times = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "iqr_ms": q[2] - q[0],
        "reps": reps,
    }


class BenchRun:
    """One benchmark invocation: an id, a timestamp and the machine facts for every row."""

    def __init__(self, name: str, results_dir: str | Path = "results") -> None:
        self.name = name
        self.dir = Path(results_dir) / "bench"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bench_id = _dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        self.meta = {
            "bench_id": self.bench_id,
            "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "hardware": hardware(),
            "git_sha": git_sha(),
            **{f"{k}_version": v for k, v in versions().items()},
        }
        self.rows: list[dict[str, Any]] = []

    @property
    def csv_path(self) -> Path:
        return self.dir / f"{self.name}.csv"

    @property
    def png_path(self) -> Path:
        return self.dir / f"{self.name}.png"

    def add(self, **row: Any) -> dict[str, Any]:
        """Add one measured case (its parameters plus ``median_ms`` and friends)."""
        full = {**row, **self.meta}
        self.rows.append(full)
        return full

    def save(self) -> Path:
        """Append this run's rows to the CSV (union of columns; old rows are kept)."""
        return append_rows(self.csv_path, self.rows)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def append_rows(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    rows = list(rows)
    if not rows:
        return path
    new = pd.DataFrame(rows)
    with FileLock(str(path) + ".lock"):
        if path.exists() and path.stat().st_size > 0:
            old = pd.read_csv(path)
            if list(old.columns) == list(new.columns):
                new.to_csv(path, mode="a", header=False, index=False)
                return path
            merged = pd.concat([old, new], ignore_index=True, sort=False)
        else:
            merged = new
        tmp = path.with_suffix(path.suffix + ".tmp")
        merged.to_csv(tmp, index=False)
        tmp.replace(path)
    return path


def latest_run(path: Path, hardware_name: str | None = None) -> pd.DataFrame:
    """Rows of the newest benchmark run in a CSV (optionally of one hardware)."""
    df = pd.read_csv(path)
    if hardware_name is not None:
        df = df[df["hardware"] == hardware_name]
    if df.empty:
        return df
    return df[df["bench_id"] == df["bench_id"].iloc[-1]]
