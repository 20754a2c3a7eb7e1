"""The time-to-accuracy figure: per configuration the mean held-out metric over seeds with
its 95 % interval, a strip of times to target below, a user's own runs drawn over it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from bench import methods  # noqa: E402
from bench.report.tables import curve, target_text  # noqa: E402
from bench.results.columns import TRAIN_TIME, metric_column  # noqa: E402
from bench.results.plots import fig_width, save_figure  # noqa: E402
from bench.sweeps.intervals import mean_interval  # noqa: E402

PER_ROW = 3  # panels per row in every figure of this module
LINE_STYLES = ("-", "--", ":", "-.")
GRID_POINTS = 240  # time points of the mean / band of the time-to-accuracy curves
BELOW_TARGET = 15  # points of the metric the time-to-accuracy axis shows under the target


def _step_values(d: pd.DataFrame, column: str, grid: np.ndarray) -> np.ndarray:
    """The metric at each grid time: the last evaluation at or before it (NaN before any)."""
    t = d[TRAIN_TIME].to_numpy(dtype=float)
    v = 100 * d[column].to_numpy(dtype=float)
    i = np.searchsorted(t, grid, side="right") - 1
    return np.where(i >= 0, v[np.clip(i, 0, None)], np.nan)


def _points(results_dir: Path, r: Mapping[str, Any]) -> pd.DataFrame | None:
    """A run's evaluations (per epoch and sub-epoch) in time order, its target metric as
    ``_metric``; None without any."""
    df = curve(results_dir, r["run_id"])
    column = metric_column(r["metric"])
    if df is None or column not in df or TRAIN_TIME not in df:
        return None
    evals = r.get("evals")
    if isinstance(evals, list) and evals:
        ev = pd.DataFrame(evals)
        if {column, TRAIN_TIME} <= set(ev.columns):
            df = pd.concat([df[[TRAIN_TIME, column]], ev[[TRAIN_TIME, column]]])
    d = df.dropna(subset=[column, TRAIN_TIME]).sort_values(TRAIN_TIME)
    return None if d.empty else d.assign(_metric=d[column])


def tta_bands(results_dir: Path, runs: pd.DataFrame) -> dict[str, dict]:
    """Per configuration (its comm label): the mean held-out metric on a time grid with its
    95 % t-interval (NaN before every run has an evaluation), the mean time to target with
    its 95 % interval, n reached of n, and the label."""
    curves: dict[str, list[tuple[pd.DataFrame, Any]]] = {}  # label -> (points, run) per run
    for _, r in runs.iterrows():
        if (d := _points(results_dir, r)) is not None:
            curves.setdefault(str(r["comm"]), []).append((d, r))
    if not curves:
        return {}
    t_max = max(float(d[TRAIN_TIME].max()) for ds in curves.values() for d, _ in ds)
    grid = np.linspace(0.0, t_max, GRID_POINTS)
    out = {}
    for name, pairs in curves.items():
        ds, rs = [d for d, _ in pairs], [r for _, r in pairs]
        vals = np.vstack([_step_values(d, "_metric", grid) for d in ds])
        every = ~np.isnan(vals).any(axis=0)  # every run has been evaluated by then
        n = len(ds)
        mean = np.where(every, vals.mean(axis=0), np.nan)
        half = np.full_like(mean, np.nan)
        if n >= 2:
            sd = vals.std(axis=0, ddof=1)
            half = np.where(every, stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n), np.nan)
        tts = [float(r["time_to_target_s"]) for r in rs if r["reached"]]
        tt, tt_lo, tt_hi = mean_interval(tts)
        trial = str(rs[0].get("protocol_trial") or "")  # the tables' name of the trial
        out[name] = {
            "grid": grid,
            "mean": mean,
            "low": mean - half,
            "high": mean + half,
            "n": len(rs),
            "n_reached": len(tts),
            "tt_mean": tt if tts else None,
            "tt_low": tt_lo,
            "tt_high": tt_hi,
            "comm_name": str(rs[0]["comm_name"]),
            "label": f"{rs[0]['comm_name']} {trial}" if trial else name,
        }
    return out


def plot_tta(
    results_dir: Path,
    runs: pd.DataFrame,
    experiment: str,
    path: Path,
    title: str = "",
    yours: pd.DataFrame | None = None,
) -> Path | None:
    """:func:`tta_bands` against training time, a panel per cluster and hardware, a strip of
    each configuration's mean time to target under it; ``yours``: a user's runs drawn over."""
    pick = (runs["experiment"] == experiment) & runs["has_curve"] & runs["trained"]
    runs = runs[pick]
    yours = yours if yours is not None and not yours.empty else None
    if runs.empty and yours is None:
        return None
    groups = list((runs if not runs.empty else yours).groupby(["cluster", "hardware"], sort=True))
    most = max(g["comm"].nunique() for _, g in groups)
    cols = min(len(groups), PER_ROW)
    rows = -(-len(groups) // cols)
    fig = plt.figure(figsize=(fig_width(cols, 6.4), rows * (4.4 + 0.3 * most)))
    grid = fig.add_gridspec(2 * rows, cols, height_ratios=[3.0, 0.2 + 0.2 * most] * rows)
    for n, ((cluster, hw), g) in enumerate(groups):
        ax = fig.add_subplot(grid[2 * (n // cols), n % cols])
        strip = fig.add_subplot(grid[2 * (n // cols) + 1, n % cols], sharex=ax)
        r0 = g.iloc[0]
        styles: dict[str, int] = {}  # configurations of one method: one colour, other dashes
        bands = sorted(tta_bands(results_dir, g).items())
        for i, (_, b) in enumerate(bands):
            colour, lw = methods.colour(b["comm_name"]), methods.width(b["comm_name"])
            ls = LINE_STYLES[styles.setdefault(b["comm_name"], 0) % len(LINE_STYLES)]
            styles[b["comm_name"]] += 1
            ax.plot(b["grid"], b["mean"], color=colour, lw=lw, ls=ls, label=b["label"])
            ax.fill_between(b["grid"], b["low"], b["high"], color=colour, alpha=0.1, lw=0)
            if b["tt_mean"] is not None:
                lo, hi = b["tt_low"], b["tt_high"]
                err = [[b["tt_mean"] - lo], [hi - b["tt_mean"]]] if lo == lo else None
                strip.errorbar([b["tt_mean"]], [i], xerr=err, fmt="*", ms=9, color=colour,
                               capsize=3, lw=1.2)  # fmt: skip
        names = [f"{b['label']} ({b['n_reached']}/{b['n']} reached)" for _, b in bands]
        strip.set_yticks(range(len(bands)), names, fontsize=7)
        for t, (_, b) in zip(strip.get_yticklabels(), bands, strict=True):
            t.set_color(methods.colour(b["comm_name"]))  # the labels are the lines' legend
        strip.set_ylim(len(bands) - 0.5, -0.5)
        strip.grid(alpha=0.3, axis="x")
        strip.set_xlabel("time to target (s; star: mean, bar: 95 % interval)")
        ax.set_xlabel("training time (s, evaluation excluded)")
        if r0["target"] is not None:
            ax.axhline(100 * r0["target"], color="k", ls="--", lw=0.8)
            low = max(0.0, 10 * np.floor((100 * r0["target"] - BELOW_TARGET) / 10))
        else:
            low = 0.0
        ax.set_ylim(low, 100.5)  # the region around the target; lower values run off it
        ax.set_xlim(left=0)  # the time from the start, before the first evaluation too
        if yours is not None:
            _draw_yours(ax, results_dir, yours, (cluster, hw), [k for k, _ in groups])
        ax.set_title(f"{cluster}\n{hw}", fontsize=9)
        ax.set_ylabel(f"held-out {target_text(r0['metric'], None)} (%)")
        ax.grid(alpha=0.3)
        if max(styles.values(), default=0) > 1 or yours is not None:  # dashes; your runs
            ax.legend(loc="lower right", fontsize=7, framealpha=0.8)
    fig.suptitle(
        title
        or f"{experiment}: time to {target_text(r0['metric'], r0['target'])} (dashed)\n"
        "line: mean over seeds from when every seed has an evaluation; band: its 95 % "
        "t-interval;\nbelow: mean time to target of the seeds that reached it (star, k/n "
        "reached) with its 95 % bootstrap interval; the tables count a miss at the sweep's budget",
        fontsize=9,
    )
    return save_figure(fig, path)


def _draw_yours(
    ax, results_dir: Path, yours: pd.DataFrame, panel: tuple, panels: list[tuple]
) -> None:
    """The user's runs that belong on ``panel`` (its cluster and hardware, else its cluster,
    else the first), each dashed with a cross at its time to target."""
    for _, r in yours.iterrows():
        key = (r["cluster"], r["hardware"])
        like = [p for i in (0, 1) for p in panels if p[i] == key[i]]  # its cluster, its hardware
        home = key if key in panels else (like + panels)[0]
        d = _points(results_dir, r) if home == panel else None
        if d is None:
            continue
        colour = methods.colour(str(r["comm_name"]))
        where = [str(k).split(";")[0] for k, p in zip(key, panel, strict=True) if k != p]
        label = f"yours: {r['run_id']} {r['comm']}" + (f" ({', '.join(where)})" * bool(where))
        ax.plot(d[TRAIN_TIME], 100 * d["_metric"], color=colour, ls="--", lw=1.6, marker="D",
                ms=4, mfc="white", zorder=5, label=label)  # fmt: skip
        if r["reached"] and r["target"] is not None:
            ax.plot([r["time_to_target_s"]], [100 * r["target"]], marker="X", ms=10,
                    color=colour, mec="k", ls="none", zorder=6)  # fmt: skip
