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
from bench.report import figures_protocol as fp
from bench.report.figures_data import Inputs, config_stats, speedups
from bench.report.report_protocol import TUNING_SUFFIX, is_protocol


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


MAX_GROUPS = 6  # panels of an experiment's figures without a protocol sweep (largest first)


def protocol_tables(inputs: Inputs) -> dict[str, Path]:
    """experiment -> the table of its newest protocol sweep (sweep ids sort by time)."""
    out: dict[str, Path] = {}
    for p in sorted(inputs.ablation):
        if not is_protocol(p) or p.stem.endswith(TUNING_SUFFIX):
            continue
        try:
            exps = pd.read_csv(p, usecols=["experiment"])["experiment"].dropna().unique()
        except (OSError, ValueError, pd.errors.ParserError):
            continue
        for exp in exps:
            out[str(exp)] = p
    return out


def figure_runs(inputs: Inputs, exp: str) -> tuple[pd.DataFrame, str]:
    """The runs an experiment's figures draw, and a phrase saying which: the evaluation
    runs of its newest protocol sweep when it has one, else its trained runs in the
    :data:`MAX_GROUPS` clusters / hardware with the most runs."""
    runs = inputs.runs
    mine = runs[(runs["experiment"] == exp) & runs["trained"]]
    table = protocol_tables(inputs).get(exp)
    if table is not None:
        ev = mine[(mine["sweep_id"] == table.stem) & (mine["protocol_role"] == "eval")]
        if not ev.empty:
            return ev, f"the evaluation runs of protocol sweep {table.stem}"
    mine = mine[mine["protocol_role"] != "tune"]
    sizes = mine.groupby(["cluster", "hardware"]).size().sort_values(ascending=False)
    keep = set(sizes.index[:MAX_GROUPS])
    left = len(sizes) - len(keep)
    picked = mine[[k in keep for k in zip(mine["cluster"], mine["hardware"], strict=True)]]
    more = f"; {left} smaller group(s) in the records table" if left else ""
    return picked, f"{len(picked)} run(s) in {len(keep)} cluster/hardware group(s){more}"


def _experiment_figures(inputs: Inputs, exp: str, stats: pd.DataFrame) -> list[Figure]:
    out, d = [], figures_dir(inputs)
    runs, which = figure_runs(inputs, exp)
    if runs.empty:
        return out
    table = protocol_tables(inputs).get(exp)
    n_curves = int(runs["has_curve"].sum())
    if n_curves:
        p = d / f"tta_{fg.slug(exp)}.png"
        out.append(
            Figure(
                p,
                f"{exp}: time to accuracy, median and band over seeds, of {which}",
                lambda p=p: fg.plot_tta(inputs.results_dir, runs, exp, p),
                "tta",
                exp,
            )
        )
    p = d / f"speedup_{fg.slug(exp)}.png"
    if table is not None:
        title = f"{exp}: each method's tuned configuration, protocol sweep {table.stem}"
        out.append(
            Figure(
                p,
                f"{exp}: speedup over dense and the best peer with 95 % intervals, {table.name}",
                lambda p=p, t=table, title=title: fp.plot_protocol_speedup(
                    pd.read_csv(t), p, title
                ),
                "speedup",
                exp,
            )
        )
        q = d / f"ratios_{fg.slug(exp)}.png"
        out.append(
            Figure(
                q,
                f"{exp}: speedup against communication / compute ratio, {table.name}'s "
                "evaluation runs composed with the performance model",
                lambda q=q, t=table: fp.plot_protocol_ratios(
                    fp.ratios_table(inputs.results_dir, pd.read_csv(t)),
                    q,
                    f"{exp}: time to target across ratios, protocol sweep {t.stem}",
                ),
                "ratios",
                exp,
            )
        )
    elif not speedups(stats[stats["experiment"] == exp], "comm", "dense").empty:
        st = config_stats(runs)
        out.append(
            Figure(
                p,
                f"{exp}: speedup over dense (mean +- std over seeds), {which}",
                lambda p=p, st=st: fg.plot_speedup(st, exp, p, _target(runs)),
                "speedup",
                exp,
            )
        )
    if n_curves:
        p = d / f"breakdown_{fg.slug(exp)}.png"
        out.append(
            Figure(
                p,
                f"{exp}: per-step time by phase, {which}",
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
