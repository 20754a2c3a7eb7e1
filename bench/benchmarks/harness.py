"""A benchmark's rows: appended to ``<results>/bench/<name>.csv`` with the machine's facts.

Each run's rows carry its hardware, versions, date and git sha, so older measurements (on
other machines too) are kept and a figure can pick the newest run.  Timing: :mod:`.timing`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from filelock import FileLock

from bench.registry import ConfigError
from bench.results.env import git_sha, hardware, versions
from bench.results.paths import bench_csv, bench_dir, bench_png
from bench.results.records import new_run_id, now_iso


class BenchRun:
    """One benchmark invocation: an id, a timestamp and the machine facts for every row."""

    def __init__(
        self, name: str, results_dir: str | Path = "results", meta: dict[str, Any] | None = None
    ) -> None:
        """A new run (its id and this machine's facts), or with ``meta`` a recorded one's."""
        self.name = name
        self.results_dir = Path(results_dir)
        self.dir = bench_dir(results_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.figure: Path | None = None  # where the figure goes (None: beside the CSV)
        if meta is not None:
            self.bench_id, self.meta = str(meta["bench_id"]), dict(meta)
        else:
            self.bench_id = new_run_id()  # the same id format as a training run's
            self.meta = {
                "bench_id": self.bench_id,
                "date": now_iso(),
                "hardware": hardware(),
                "git_sha": git_sha(),
                **{f"{k}_version": v for k, v in versions().items()},
            }
        self.rows: list[dict[str, Any]] = []

    @classmethod
    def newest(cls, name: str, results_dir: str | Path = "results") -> BenchRun:
        """The newest run recorded in ``<results_dir>/bench/<name>.csv``, read back (to redraw
        its figure without measuring again); its machine facts are the recorded ones."""
        csv = bench_csv(results_dir, name)
        if not csv.is_file():
            raise ConfigError(f"no {csv}: run `python -m reproduce bench {name}` first")
        run = cls(name, results_dir)
        df = latest_run(run.csv_path)
        run.rows = df.to_dict("records")
        run.bench_id = str(df["bench_id"].iloc[0])
        run.meta = {k: run.rows[0][k] for k in run.meta if k in run.rows[0]}
        return run

    @classmethod
    def from_rows(
        cls, name: str, rows: pd.DataFrame, results_dir: str | Path, png: Path | None = None
    ) -> BenchRun:
        """A recorded run of benchmark ``name`` (``rows``, one ``bench_id``) held in its own
        results directory, its CSV written there (for replots that read it), its figure
        going to ``png``; its machine facts are the recorded ones (nothing is measured)."""
        first = rows.iloc[0]
        meta = {k: first[k] for k in ("bench_id", "date", "hardware", "git_sha") if k in rows}
        meta.setdefault("hardware", "unknown hardware")
        run = cls(name, results_dir, meta=meta)
        run.rows = rows.to_dict("records")
        run.figure = png
        rows.to_csv(run.csv_path, index=False)
        if png is not None:
            png.parent.mkdir(parents=True, exist_ok=True)
        return run

    @property
    def csv_path(self) -> Path:
        return bench_csv(self.results_dir, self.name)

    @property
    def png_path(self) -> Path:
        return self.figure if self.figure is not None else bench_png(self.results_dir, self.name)

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


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2


def have_dali() -> bool:
    """Whether NVIDIA DALI is installed."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return False
    return True


def finite(x: Any) -> float | None:
    """A finite number, or None (absent, null, text, NaN): a headline's input."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def fmt(x: float | None, unit: str = "", digits: int = 2) -> str:
    """A headline's number: ``n/a`` when there is none."""
    return "n/a" if x is None else f"{x:,.{digits}f}{unit}"
