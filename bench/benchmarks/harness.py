"""A benchmark's rows: appended to ``<results>/bench/<name>.csv`` with the machine's facts
(hardware, versions, date, git sha), so older runs, on other machines too, are kept."""

from __future__ import annotations

import math
import os
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
        self.name, self.results_dir = name, Path(results_dir)
        bench_dir(results_dir).mkdir(parents=True, exist_ok=True)
        self.figure: Path | None = None  # where the figure goes (None: beside the CSV)
        if meta is None:
            meta = {
                "bench_id": new_run_id(),  # the same id format as a training run's
                "date": now_iso(),
                "hardware": hardware(),
                "git_sha": git_sha(),
                **{f"{k}_version": v for k, v in versions().items()},
            }
        self.bench_id, self.meta = str(meta["bench_id"]), dict(meta)
        self.rows: list[dict[str, Any]] = []

    @classmethod
    def newest(cls, name: str, results_dir: str | Path = "results") -> BenchRun:
        """The newest run in ``<results_dir>/bench/<name>.csv`` (to redraw its figure)."""
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
        """A recorded run (``rows``, one ``bench_id``) with its CSV written to its own
        ``results_dir`` (for replots that read it) and its figure going to ``png``."""
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
        self.rows.append({**row, **self.meta})
        return self.rows[-1]

    def save(self) -> Path:
        """Append this run's rows to the CSV (union of columns; old rows are kept)."""
        path, new = self.csv_path, pd.DataFrame(self.rows)
        if new.empty:
            return path
        with FileLock(str(path) + ".lock"):
            if path.exists() and path.stat().st_size > 0:
                old = pd.read_csv(path)
                if list(old.columns) == list(new.columns):
                    new.to_csv(path, mode="a", header=False, index=False)
                    return path
                new = pd.concat([old, new], ignore_index=True, sort=False)
            tmp = path.with_suffix(path.suffix + ".tmp")
            new.to_csv(tmp, index=False)
            tmp.replace(path)
        return path

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)


def latest_run(path: Path) -> pd.DataFrame:
    """Rows of the newest benchmark run in a CSV."""
    df = pd.read_csv(path)
    return df if df.empty else df[df["bench_id"] == df["bench_id"].iloc[-1]]


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
