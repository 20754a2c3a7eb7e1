"""Benchmark figures and headline numbers from ``<dir>/bench/<name>.csv`` alone.

The figures are each benchmark's own replot function (the registry of
:mod:`bench.benchmarks`), fed the newest recorded run of each hardware in the CSV and
pointed at ``<dir>/figures/bench_<name>_<hardware>.png``: the figures under ``bench/``
are left as they are.  The headline numbers are each benchmark's own ``headline``,
read from the same newest runs.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.benchmarks import load_all
from bench.benchmarks.harness import BenchRun
from bench.report.figures import slug


@dataclass
class BenchFigure:
    name: str
    hardware: str
    bench_id: str
    paths: list[Path]
    error: str = ""


def newest_runs(csv: Path, problems: list[str] | None = None) -> list[tuple[str, pd.DataFrame]]:
    """(hardware, rows of the newest run on it) for each hardware of a benchmark CSV; an
    unreadable CSV gives none, and a line in ``problems`` naming it."""
    try:
        df = pd.read_csv(csv)
    except (OSError, ValueError, pd.errors.ParserError) as e:
        if problems is not None and not any(str(csv) in p for p in problems):
            problems.append(f"{csv}: unreadable, its figure and numbers are left out ({e})")
        return []
    if df.empty or "bench_id" not in df:
        return []
    if "hardware" not in df:
        df = df.assign(hardware="unknown hardware")
    out = []
    for hw in df["hardware"].dropna().unique():
        sub = df[df["hardware"] == hw]
        out.append((str(hw), sub[sub["bench_id"] == sub["bench_id"].iloc[-1]]))
    return out


def figure_path(figures_dir: Path, name: str, hardware: str) -> Path:
    return figures_dir / f"bench_{name}_{slug(hardware.split(';')[0])}.png"


def replot(name: str, rows: pd.DataFrame, png: Path) -> BenchFigure:
    """One hardware's newest run of benchmark ``name`` drawn by the benchmark's own replot."""
    spec = load_all().get(name)
    fig = BenchFigure(name, str(rows["hardware"].iloc[0]), str(rows["bench_id"].iloc[0]), [])
    for old in (png, png.with_suffix(".scaling.png")):
        old.unlink(missing_ok=True)  # this command's own figure of an earlier call
    with tempfile.TemporaryDirectory() as tmp:
        run = BenchRun.from_rows(name, rows, tmp, png)
        try:
            spec.replot(run)
        except Exception as e:  # noqa: BLE001 - one bad CSV must not stop the report
            fig.error = f"{type(e).__name__}: {e}"
    fig.paths = [p for p in (png, png.with_suffix(".scaling.png")) if p.is_file()]
    return fig


def registered() -> list[str]:
    return list(load_all().names())


def headlines() -> dict[str, Callable[[pd.DataFrame], list[str]]]:
    """name -> the headline function of each benchmark that has one."""
    reg = load_all()
    return {n: reg.get(n).headline for n in reg.names() if reg.get(n).headline is not None}
