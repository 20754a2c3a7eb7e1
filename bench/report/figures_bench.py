"""Benchmark figures and headline numbers from ``<dir>/bench/<name>.csv`` alone.

The figures are each benchmark's own replot function (the registry of
:mod:`bench.benchmarks`), fed the newest recorded run of each hardware in the CSV and
pointed at ``<dir>/figures/bench_<name>_<hardware>.png``: the figures under ``bench/``
are left as they are.  The headline numbers are read from the same newest runs.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.report.figures import slug
from bench.report.figures_data import num


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
    from bench.benchmarks import load_all

    spec = load_all().get(name)
    fig = BenchFigure(name, str(rows["hardware"].iloc[0]), str(rows["bench_id"].iloc[0]), [])
    for old in (png, png.with_suffix(".scaling.png")):
        old.unlink(missing_ok=True)  # this command's own figure of an earlier call
    with tempfile.TemporaryDirectory() as tmp:
        run = _run_of(name, rows, Path(tmp), png)
        try:
            spec.replot(run)
        except Exception as e:  # noqa: BLE001 - one bad CSV must not stop the report
            fig.error = f"{type(e).__name__}: {e}"
    fig.paths = [p for p in (png, png.with_suffix(".scaling.png")) if p.is_file()]
    return fig


def registered() -> list[str]:
    from bench.benchmarks import load_all

    return list(load_all().names())


def _run_of(name: str, rows: pd.DataFrame, tmp: Path, png: Path):
    """A :class:`BenchRun` holding ``rows`` (also as its CSV, for replots that read it)
    whose figure goes to ``png``."""
    from bench.benchmarks.harness import BenchRun

    class _Run(BenchRun):
        @property
        def csv_path(self) -> Path:
            return tmp / f"{name}.csv"

        @property
        def png_path(self) -> Path:
            return png

    run = _Run.__new__(_Run)
    run.name, run.dir = name, tmp
    run.bench_id = str(rows["bench_id"].iloc[0])
    run.rows = rows.to_dict("records")
    run.meta = {k: run.rows[0][k] for k in ("bench_id", "date", "hardware", "git_sha") if k in rows}
    run.meta.setdefault("hardware", "unknown hardware")
    rows.to_csv(run.csv_path, index=False)
    png.parent.mkdir(parents=True, exist_ok=True)
    return run


def _f(x: float | None, unit: str = "", digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}{unit}"


def topk_headline(rows: pd.DataFrame) -> list[str]:
    """The largest tensor of the run at its smallest density: torch.topk vs the fastest
    MSTopK variant, same run."""
    if not {"method", "numel", "density", "median_ms"} <= set(rows.columns):
        return []
    r = rows[
        (rows["density"] > 0) & rows["method"].astype(str).str.startswith(("torch.topk", "mstopk"))
    ]
    if "input" in r:
        r = r[r["input"].fillna("gaussian") == "gaussian"]
    if r.empty:
        return []
    r = r[r["numel"] == r["numel"].max()]
    r = r[r["density"] == r["density"].min()]
    base = r[r["method"] == "torch.topk"]
    ours = r[
        r["method"].astype(str).str.startswith("mstopk")
        & ~r["method"].astype(str).str.contains(r"\+ef")
    ]
    if base.empty or ours.empty:
        return []
    b = float(base["median_ms"].median())
    best = ours.loc[ours["median_ms"].idxmin()]
    n, d = int(best["numel"]), best["density"]
    ms = num(best["median_ms"])
    return [
        f"top-k of {n:,} values at density {d:g}: {best['method']} {_f(ms, ' ms')} "
        f"vs torch.topk {_f(b, ' ms')}: {b / best['median_ms']:.2f}x"
    ]


def update_headline(rows: pd.DataFrame) -> list[str]:
    """Per model and optimizer: the flat update against naive and fused, same run."""
    need = {"model", "optimizer", "mode", "median_ms"}
    if not need <= set(rows.columns):
        return []
    rows = rows.assign(variant=rows.get("variant", pd.Series("", index=rows.index)).fillna(""))
    out = []
    for (model, opt), g in rows[rows["variant"] == ""].groupby(["model", "optimizer"], sort=False):
        ms = {m: float(x["median_ms"].median()) for m, x in g.groupby("mode")}
        if "flat" not in ms or "naive" not in ms:
            continue
        line = (
            f"{model} {opt}: flat {_f(ms['flat'], ' ms')} vs naive {_f(ms['naive'], ' ms')} "
            f"({ms['naive'] / ms['flat']:.2f}x)"
        )
        if "fused" in ms:
            line += f", vs torch fused {_f(ms['fused'], ' ms')} ({ms['fused'] / ms['flat']:.2f}x)"
        out.append(line)
    return out


def input_headline(rows: pd.DataFrame) -> list[str]:
    """Per loader and cache, throttled storage, epochs 2 on: images/s against no cache."""
    need = {"loader", "cache", "epoch", "images_per_s"}
    if not need <= set(rows.columns):
        return []
    r = rows[rows["epoch"] >= 2]
    if "throttled" in r:
        r = r[r["throttled"].astype(str) == "True"]
    out = []
    for loader, g in r.groupby("loader", sort=False):
        ips = g.groupby("cache", sort=False)["images_per_s"].mean()
        if "none" not in ips:
            continue
        parts = [f"{c} {v:,.0f}/s ({v / ips['none']:.2f}x)" for c, v in ips.items() if c != "none"]
        out.append(
            f"{loader}, throttled storage, epochs 2+: no cache {ips['none']:,.0f} images/s; "
            + ", ".join(parts)
        )
    return out


HEADLINES = {"topk": topk_headline, "update": update_headline, "input": input_headline}
