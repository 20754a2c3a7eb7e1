"""Which figures one results directory gives, and drawing them.

:func:`plan` lists every figure the inputs support, each with what it shows and a
function that draws it, without drawing anything (``figures --dry-run`` prints the plan);
:func:`draw` draws them.  Figure files are named by what they show, so that each call
replaces the figures of the call before and nothing else in ``<dir>/figures/``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bench.report import figures as fg
from bench.report import figures_bench as fb
from bench.report.figures_data import Inputs, config_stats, speedups


@dataclass
class Figure:
    path: Path
    what: str  # one line: what it shows and from which inputs
    make: Callable[[], object] = field(repr=False)
    kind: str = ""  # tta, speedup, breakdown, scaling, bench
    experiment: str = ""
    drawn: bool = False
    error: str = ""
    extra: list[Path] = field(default_factory=list)  # further files the same call drew


def figures_dir(inputs: Inputs) -> Path:
    return inputs.results_dir / "figures"


def _target(runs: pd.DataFrame) -> str:
    """The experiment's target as its records name it (the first record's)."""
    r = runs.iloc[0]
    return fg.target_text(r["metric"], r["target"])


def _experiment_figures(inputs: Inputs, exp: str, stats: pd.DataFrame) -> list[Figure]:
    out, d, runs = [], figures_dir(inputs), inputs.runs
    mine = runs[runs["experiment"] == exp]
    n_curves = int(mine["has_curve"].sum())
    if n_curves:
        p = d / f"tta_{fg.slug(exp)}.png"
        out.append(
            Figure(
                p,
                f"{exp}: time-to-accuracy curves of {n_curves} run(s)",
                lambda p=p: fg.plot_tta(inputs.results_dir, runs, exp, p),
                "tta",
                exp,
            )
        )
    sp = speedups(stats[stats["experiment"] == exp], "comm", "dense")
    if not sp.empty:
        p = d / f"speedup_{fg.slug(exp)}.png"
        out.append(
            Figure(
                p,
                f"{exp}: speedup over dense of {len(sp)} configuration(s)",
                lambda p=p: fg.plot_speedup(stats, exp, p, _target(mine)),
                "speedup",
                exp,
            )
        )
    if n_curves:
        p = d / f"breakdown_{fg.slug(exp)}.png"
        out.append(
            Figure(
                p,
                f"{exp}: per-step time by phase",
                lambda p=p: fg.plot_breakdown(
                    fg.breakdown_table(inputs.results_dir, runs, exp), exp, p
                ),
                "breakdown",
                exp,
            )
        )
    return out


def _scaling_figure(inputs: Inputs) -> list[Figure]:
    if not inputs.scaling:
        return []
    p = figures_dir(inputs) / "scaling_efficiency.png"

    def make() -> Path | None:
        frames = [pd.read_csv(f) for f in inputs.scaling]
        return fg.plot_scaling(pd.concat(frames, ignore_index=True, sort=False), p)

    names = ", ".join(f.name for f in inputs.scaling)
    return [Figure(p, f"scaling efficiency against nodes, from {names}", make, "scaling")]


def _bench_figures(inputs: Inputs) -> list[Figure]:
    out = []
    known = set(fb.registered())
    for name, csv in inputs.bench.items():
        if name not in known:
            continue
        for hw, rows in fb.newest_runs(csv, inputs.problems):
            p = fb.figure_path(figures_dir(inputs), name, hw)
            what = (
                f"bench {name}: newest run {rows['bench_id'].iloc[0]} on {hw.split(';')[0]} "
                f"({len(rows)} rows of {csv.name})"
            )
            out.append(
                Figure(p, what, lambda n=name, r=rows, p=p: fb.replot(n, r, p), "bench", name)
            )
    return out


def plan(inputs: Inputs, experiments: list[str] | None = None) -> list[Figure]:
    """Every figure the inputs support (restricted to ``experiments`` when given)."""
    stats = config_stats(inputs.runs)
    exps = sorted(inputs.runs["experiment"].unique())
    out = []
    for exp in exps:
        if experiments is None or exp in experiments:
            out += _experiment_figures(inputs, exp, stats)
    return out + _scaling_figure(inputs) + _bench_figures(inputs)


def draw(figs: list[Figure]) -> list[Figure]:
    """Draw each figure; one that fails or has nothing to draw is marked, not fatal."""
    for f in figs:
        try:
            res = f.make()
        except Exception as e:  # noqa: BLE001 - a bad input skips its figure, not the report
            f.error = f"{type(e).__name__}: {e}"
            continue
        if isinstance(res, fb.BenchFigure):
            f.error = res.error
            f.drawn = bool(res.paths) and not res.error
            f.extra = [p for p in res.paths if p != f.path]
        else:
            f.drawn = res is not None
    return figs
