"""The report's figures, drawn from records, curves and CSVs alone (nothing is trained).

:func:`plan` lists every figure the inputs support, :func:`draw` draws them: per
experiment the time-to-accuracy bands over seeds, the speedup over dense (with 95 %
intervals from a protocol sweep), the composition across communication / compute ratios
and the per-step breakdown; the scaling study; each benchmark's own figure.
"""

from __future__ import annotations

import tempfile
import textwrap
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats  # noqa: E402

from bench import methods  # noqa: E402
from bench.benchmarks import load_all  # noqa: E402
from bench.benchmarks.harness import BenchRun  # noqa: E402
from bench.report.scaling import plot_scaling, read_scaling, scaling_caption  # noqa: E402
from bench.report.tables import (  # noqa: E402
    CONFIG,
    GROUP,
    Inputs,
    cluster_title,
    config_stats,
    curve,
    num,
    protocol_tables,
    speedups,
    target_text,
)
from bench.results.columns import TRAIN_TIME, metric_column  # noqa: E402
from bench.results.plots import PHASE_COLOURS, fig_width, save_figure  # noqa: E402
from bench.sweeps import ratios  # noqa: E402
from bench.sweeps.intervals import ci_text, mean_interval  # noqa: E402

# per-step phases of a curve row: (label, column(s)); the first column present is used
PHASES = (
    ("data wait", ("time/data_s",)),
    ("forward+backward", ("time/compute_s",)),
    ("selection", ("time/select_s",)),
    ("communication", ("comm/exposed_s", "time/exposed_comm_s", "time/comm_s")),
    ("optimizer update", ("time/update_s",)),
)
EXPOSED = ("comm/exposed_s", "time/exposed_comm_s")


def slug(text: str) -> str:
    """A file-name-safe form of a label."""
    out = "".join(c.lower() if c.isalnum() else "-" for c in text)
    return "-".join(p for p in out.split("-") if p)


def config_name(row) -> str:
    return " / ".join(str(row[c]) for c in CONFIG)


def _panels(n: int, w: float = 6.0, h: float = 4.2, extra: float = 0.0, **kw: Any):
    """``n`` panels in rows of at most :data:`PER_ROW`, the figure capped in width
    (``kw``: to :func:`matplotlib.pyplot.subplots`, e.g. ``sharex``)."""
    cols = min(n, PER_ROW)
    rows = -(-n // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(fig_width(cols, w, extra), h * rows), squeeze=False, **kw
    )
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n]


PER_ROW = 3  # panels per row in every figure of this module
LINE_STYLES = ("-", "--", ":", "-.")
GRID_POINTS = 240  # time points of the median / band of the time-to-accuracy curves


def _step_values(d: pd.DataFrame, column: str, grid: np.ndarray) -> np.ndarray:
    """The metric a run had reached at each grid time: its last evaluation at or before
    that time (NaN before the first), held after its last one."""
    t = d[TRAIN_TIME].to_numpy(dtype=float)
    v = 100 * d[column].to_numpy(dtype=float)
    i = np.searchsorted(t, grid, side="right") - 1
    out = np.where(i >= 0, v[np.clip(i, 0, None)], np.nan)
    return out


def _points(results_dir: Path, r: Mapping[str, Any]) -> pd.DataFrame | None:
    """A run's evaluations (per epoch, and the sub-epoch ones where it has them) in time
    order, its target metric as ``_metric``; None without any."""
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
    """Per configuration (its comm label, as the tables name it): the time grid, the
    mean over its runs of the held-out metric and its 95 % t-interval, from the first
    time every run has an evaluation on (NaN before: no mean of a subset); the mean time
    to target of the runs that reached it and its 95 % interval (as the tables give it),
    n (reached of runs) and the label (method and tuned trial, as the tables name it)."""
    curves: dict[str, list[pd.DataFrame]] = {}
    meta: dict[str, list] = {}
    for _, r in runs.iterrows():
        d = _points(results_dir, r)
        if d is None:
            continue
        name = str(r["comm"])
        curves.setdefault(name, []).append(d)
        meta.setdefault(name, []).append(r)
    if not curves:
        return {}
    t_max = max(float(d[TRAIN_TIME].max()) for ds in curves.values() for d in ds)
    grid = np.linspace(0.0, t_max, GRID_POINTS)
    out = {}
    for name, ds in curves.items():
        vals = np.vstack([_step_values(d, "_metric", grid) for d in ds])
        every = ~np.isnan(vals).any(axis=0)  # every run has been evaluated by then
        n = len(ds)
        mean = np.where(every, vals.mean(axis=0), np.nan)
        half = np.full_like(mean, np.nan)
        if n >= 2:
            sd = vals.std(axis=0, ddof=1)
            half = np.where(every, stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n), np.nan)
        rs = meta[name]
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
    """Held-out target metric against training time: per method the mean over its runs
    (seeds) and its 95 % interval, drawn from the time every run has an evaluation, one
    panel per cluster and hardware, its y axis from :data:`BELOW_TARGET` points under the
    target; under it a strip of one row per configuration, a star at its mean time to
    target with its interval (on the target line they would hide each other).
    ``yours``: a user's runs, each drawn on its own over the panel of its cluster and
    hardware (else of its cluster, else the first)."""
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
        "t-interval;\nbelow: mean time to target (star) with its 95 % bootstrap interval "
        "(as the tables)",
        fontsize=9,
    )
    return save_figure(fig, path)


def _draw_yours(
    ax, results_dir: Path, yours: pd.DataFrame, panel: tuple, panels: list[tuple]
) -> None:
    """The user's runs that belong on ``panel``: each its own dashed line with open
    diamonds at its evaluations, in its method's colour, over the reference bands, and a
    cross at its time to target."""
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


BELOW_TARGET = 15  # points of the metric the time-to-accuracy axis shows under the target


def plot_speedup(
    stats: pd.DataFrame, experiment: str, path: Path, target: str = "target"
) -> Path | None:
    """Time-to-target speedup over dense per configuration (mean over seeds, error bar one
    standard deviation), one panel per cluster and hardware that has a dense baseline.
    Configurations that missed the target in every run are shown at 0 with their count.
    Used where no protocol sweep gives intervals (:func:`plot_protocol_speedup`)."""
    sp = speedups(stats[stats["experiment"] == experiment])
    if sp.empty:
        return None
    groups = list(sp.groupby(["cluster", "hardware"], sort=True))
    most = int(sp.groupby(["cluster", "hardware"]).size().max())
    fig, axes = _panels(len(groups), w=max(5.0, 0.9 * most), h=4.6)
    for ax, ((cluster, hw), g) in zip(axes, groups, strict=True):
        labels = [config_name(r) for _, r in g.iterrows()]
        heights = [num(s) or 0.0 for s in g["speedup"]]
        errs = [num(s) or 0.0 for s in g["speedup_std"]]
        colours = [methods.colour(c) for c in g["comm_name"]]
        ax.bar(range(len(g)), heights, yerr=errs, capsize=4, color=colours)
        for i, (_, r) in enumerate(g.iterrows()):
            txt = f"{r['n_reached']}/{r['n_runs']}"
            ax.text(i, heights[i], txt, ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="k", lw=1, ls="--")
        ax.set_xticks(range(len(g)), labels, rotation=35, ha="right", fontsize=6)
        ax.set_ylabel(f"speedup in time to {target} over dense (x)")
        ax.set_title(f"{cluster}\n{hw}", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(
        f"{experiment}: speedup over dense DDP (mean +- std over seeds; "
        "number: runs reached / runs)",
        fontsize=10,
    )
    return save_figure(fig, path)


def step_phases(df: pd.DataFrame, exchange_in_update: bool = False) -> dict[str, float] | None:
    """Mean seconds per step of each phase over a curve's epochs.  Forward+backward is the
    loop's compute time less the selection and communication measured inside the hook
    (which run within the backward pass); with ``exchange_in_update`` (DeMo: they run in
    its optimizer step) the update is the loop's update time less them instead.  None
    when the curve has no phase columns."""
    if "time/compute_s" not in df:
        return None
    out = {}
    for label, cols in PHASES:
        col = next((c for c in cols if c in df), None)
        out[label] = float(df[col].mean()) if col is not None else 0.0
    out = {k: (0.0 if v != v else v) for k, v in out.items()}
    inner = out["selection"] + out["communication"]
    holder = "optimizer update" if exchange_in_update else "forward+backward"
    out[holder] = max(0.0, out[holder] - inner)
    return out


def breakdown_table(results_dir: Path, runs: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """Mean per-step phase times (s) per group and configuration over its runs' curves,
    with ``n`` (the runs averaged) and ``label`` (the method and its tuned trial, as the
    tables name it, or the configuration's comm label)."""
    rows = []
    for _, r in runs[(runs["experiment"] == experiment) & runs["has_curve"]].iterrows():
        df = curve(results_dir, r["run_id"])
        name = str(r["comm_name"])
        inside = name in methods.METHODS and methods.get(name).exchange_in_update
        ph = step_phases(df, inside) if df is not None else None
        if ph:
            exposed = any(c in df for c in EXPOSED)
            trial = str(r.get("protocol_trial") or "")
            label = f"{name} {trial}" if trial else str(r["comm"])
            if inside and not df.get("time/comm_s", pd.Series([0.0])).any():  # not timed yet
                label += " (update holds its all-gather)"
            keys = {k: r[k] for k in GROUP + CONFIG}
            rows.append({**keys, **ph, "exposed": exposed, "label": label, "comm_name": name})
    if not rows:
        return pd.DataFrame()
    t = pd.DataFrame(rows).groupby(GROUP + CONFIG, sort=True)
    out = t[[p for p, _ in PHASES]].mean()
    out["exposed"] = t["exposed"].all()
    out[["label", "comm_name"]] = t[["label", "comm_name"]].first()
    out["n"] = t.size()
    return out.reset_index()


def plot_breakdown(table: pd.DataFrame, experiment: str, path: Path) -> Path | None:
    """Stacked per-step time (ms) by phase, one horizontal bar per configuration (its
    label and n runs; the settings common to the panel in its title), one panel per
    cluster and hardware, one legend for the figure."""
    if table.empty:
        return None
    groups = list(table.groupby(["cluster", "hardware"], sort=True))
    most = int(table.groupby(["cluster", "hardware"]).size().max())
    # one x scale for every panel: the same ms reads the same length side by side
    fig, axes = _panels(len(groups), w=7.0, h=2.3 + 0.3 * most, sharex=True)
    for ax, ((cluster, hw), g) in zip(axes, groups, strict=True):
        left = np.zeros(len(g))
        for label, _ in PHASES:
            vals = 1e3 * g[label].to_numpy(dtype=float)
            ax.barh(range(len(g)), vals, left=left, color=PHASE_COLOURS[label], label=label)
            left = left + vals
        varying = [c for c in CONFIG[1:] if g[c].astype(str).nunique() > 1]
        names = [
            " / ".join([str(r["label"]), *(str(r[c]) for c in varying)]) + f" (n = {r['n']})"
            for _, r in g.iterrows()
        ]
        ax.set_yticks(range(len(g)), names, fontsize=8)
        for t, c in zip(ax.get_yticklabels(), g["comm_name"], strict=True):
            t.set_color(methods.colour(c))  # the method's colour: the bars are the phases'
        ax.invert_yaxis()
        ax.set_xlabel("ms per step (mean over epochs, runs)")
        ax.xaxis.set_tick_params(labelbottom=True)  # shared, yet each panel keeps its numbers
        common = ", ".join(f"{c} {g[c].iloc[0]}" for c in CONFIG[1:] if c not in varying)
        where = "\n".join(textwrap.wrap(f"{cluster}; {hw}", 48))  # fits over a narrow panel
        ax.set_title(where + (f"\nevery bar: {common}" if common else ""), fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    exposed = bool(table["exposed"].all())
    note = (
        "exposed communication"
        if exposed
        else "communication time measured in the hook, not exposed"
    )
    h, labels = axes[0].get_legend_handles_labels()
    fig.legend(h, labels, loc="lower center", ncol=len(PHASES), fontsize=7, frameon=False)
    fig.suptitle(f"{experiment}: per-step time by phase\n({note})", fontsize=10)
    h_in = fig.get_figheight()
    fig.tight_layout(rect=(0, 0.35 / h_in, 1, 1))
    return save_figure(fig, path, layout=False)


def _speedup_blocks(df: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(heading, best peer, rows) per cluster a protocol table quotes, its rows by speedup
    over dense."""
    out = []
    for cluster, g in df.groupby("for_cluster", sort=False):
        named = g["best_peer"].dropna().astype(str)
        named = named[named != ""]
        g = g.sort_values("speedup_vs_dense", ascending=False, na_position="first")
        title = cluster_title(str(cluster), float(g["ratio"].iloc[0]))
        out.append((title, str(named.iloc[0]) if len(named) else "peer", g))
    return out


def plot_protocol_speedup(df: pd.DataFrame, path: Path, title: str) -> Path | None:
    """Two panels: speedup over dense and over the best peer, one row per method (its
    selected trial), point = ratio of times, bar = 95 % interval, the verdict written
    beside it: one block of rows per cluster the table quotes each method tuned for, under
    its heading, each against that cluster's dense and best peer."""
    if df.empty or "speedup_vs_dense" not in df:
        return None
    rows: list[tuple[float, pd.Series, str]] = []  # (y, row, the block's peer)
    heads: list[tuple[float, str]] = []
    y = 0.0
    for head, peer, g in _speedup_blocks(df):
        heads.append((y, f"{head}; best peer {peer}"))
        y += 1
        for _, r in g.iterrows():
            rows.append((y, r, peer))
            y += 1
        y += 0.4
    height = 1.7 + 0.36 * y
    fig, axes = plt.subplots(1, 2, figsize=(fig_width(2, 6.2), height), sharey=True)
    base, paper = methods.baseline(), methods.paper()
    n_seeds = int(df["n_runs"].max())
    panels = (("speedup_vs_dense", f"{base} DDP"), ("speedup_vs_peer", "its cluster's best peer"))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for i, r, peer in rows:
            m, lo, hi = r[key], r[f"{key}_ci_low"], r[f"{key}_ci_high"]
            itself = r["comm"] == (base if key == "speedup_vs_dense" else peer)
            if itself:
                ax.annotate("the baseline", (1.0, i), xytext=(6, 0), textcoords="offset points",
                            va="center", fontsize=7)  # fmt: skip
                continue
            if m != m:
                continue
            colour = methods.colour(r["comm"])
            err = [[max(0.0, m - lo)], [max(0.0, hi - m)]] if lo == lo else None
            style = {"ms": 8, "lw": 2.2} if r["comm"] in paper else {"ms": 6, "lw": 1.4}
            ax.errorbar([m], [i], xerr=err, fmt="o", color=colour, capsize=4, **style)
            verdict = str(r[key.replace("speedup", "verdict")])
            verdict = verdict if verdict in ("faster", "slower") else "no difference"
            ax.annotate(
                f"{ci_text(m, lo, hi, 2, 'x')}, {verdict}",
                (hi if hi == hi else m, i),
                xytext=(6, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
                bbox={"fc": "white", "ec": "none", "pad": 0.5},  # over the line at 1
            )
        for h, _ in heads[1:]:
            ax.axhline(h - 0.7, color="0.6", lw=0.6)
        ax.axvline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xlabel(f"speedup over {label} (> 1: sooner to target)")
        ax.grid(alpha=0.3, axis="x")
        lo_all = pd.concat([df[f"{key}_ci_low"], df[key]]).min()
        hi_all = pd.concat([df[f"{key}_ci_high"], df[key]]).max()
        if lo_all == lo_all and hi_all == hi_all:
            left = min(0.8, lo_all - 0.1)  # room on the right for the written interval
            ax.set_xlim(left, max(1.25, hi_all + 0.8 * (hi_all - left)))
    axes[1].patch.set_visible(False)  # a heading runs on across both panels
    for h, text in heads:  # on the row kept free for it
        axes[0].text(0.01, h, text, transform=axes[0].get_yaxis_transform(), fontsize=8.5,
                     fontweight="bold", va="center", clip_on=False)  # fmt: skip
    labels = [f"{r['comm']} {r['trial']} ({r['n_reached']}/{r['n_runs']})" for _, r, _ in rows]
    axes[0].set_yticks([i for i, _, _ in rows], labels, fontsize=8)
    axes[0].set_ylim(y - 0.4, -0.6)
    for t, (_, r, _) in zip(axes[0].get_yticklabels(), rows, strict=True):
        t.set_color(methods.colour(r["comm"]))
        if r["comm"] in paper:
            t.set_fontweight("bold")
    how = (
        "point: geometric-mean ratio of times to target (a miss: its whole run); bar: 95 % "
        f"Welch interval on log time over {n_seeds} evaluation seeds; (k/n): seeds that "
        "reached the target"
    )
    fig.suptitle(f"{title}\n{how}", fontsize=9)
    return save_figure(fig, path)


HEADLINE = "paper"  # the cluster whose tuned configurations a sweep's ratio figure draws


def table_run_ids(table: pd.DataFrame) -> set[str]:
    """The run ids a sweep table counts (its ``run_ids`` column; empty without one)."""
    if "run_ids" not in table:
        return set()
    return {i for v in table["run_ids"].dropna() for i in str(v).replace(",", " ").split()}


def ratio_runs(results_dir: Path, table: pd.DataFrame) -> list:
    """The sweep's evaluation runs as :class:`bench.sweeps.ratios.Run` (grouped by method),
    the runs the composition uses: each method's configuration tuned for :data:`HEADLINE`
    (a method's runs of several configurations do not average to one curve); ``[]`` when
    none has step counts."""
    sweep = str(table["sweep_id"].iloc[0])
    if (table["for_cluster"] == HEADLINE).any():
        table = table[table["for_cluster"] == HEADLINE]  # one configuration per method
    ids = table_run_ids(table)

    def select(r: Mapping[str, Any]) -> bool:
        res = (r.get("config") or {}).get("results") or {}
        return res.get("sweep_id") == sweep and (not ids or r.get("run_id") in ids)

    runs, _ = ratios.load_runs(results_dir, select, group=methods.method_of)
    return runs


def ratios_table(results_dir: Path, table: pd.DataFrame, n_boot: int = 2000) -> pd.DataFrame:
    """The composition (:func:`bench.sweeps.ratios.compose`) of the sweep's evaluation
    runs on the ratio grid and at the named settings; empty when it cannot be made."""
    runs = ratio_runs(results_dir, table)
    if not runs or methods.baseline() not in {r.group for r in runs}:
        return pd.DataFrame()
    named = ratios.named_ratios()
    grid = sorted(set(ratios.GRID) | set(named.values()))
    return ratios.compose(runs, grid, n_boot=n_boot)


@dataclass
class BenchFigure:
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


def replot(name: str, rows: pd.DataFrame, png: Path) -> BenchFigure:
    """One hardware's newest run of benchmark ``name`` drawn by the benchmark's own replot."""
    spec = load_all().get(name)
    fig = BenchFigure([])
    extra = [png.with_suffix(f".{what}.png") for what in ("scaling", "overlap")]
    for old in (png, *extra):
        old.unlink(missing_ok=True)  # this command's own figure of an earlier call
    with tempfile.TemporaryDirectory() as tmp:
        run = BenchRun.from_rows(name, rows, tmp, png)
        try:
            spec.replot(run)
        except Exception as e:  # noqa: BLE001 - one bad CSV must not stop the report
            fig.error = f"{type(e).__name__}: {e}"
    fig.paths = [p for p in (png, *extra) if p.is_file()]
    return fig


def headlines() -> dict[str, Callable[[pd.DataFrame], list[str]]]:
    """name -> the headline function of each benchmark that has one."""
    reg = load_all()
    return {n: reg.get(n).headline for n in reg.names() if reg.get(n).headline is not None}


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


def _ratios_figure(results_dir: Path, table: Path, path: Path, title: str) -> Path | None:
    df = ratios_table(results_dir, pd.read_csv(table))
    return None if df.empty else ratios.plot(df, path, title)


def _target(runs: pd.DataFrame) -> str:
    """The experiment's target as its records name it (the first record's)."""
    r = runs.iloc[0]
    return target_text(r["metric"], r["target"])


MAX_GROUPS = 6  # panels of an experiment's figures without a protocol sweep (largest first)


def figure_runs(inputs: Inputs, exp: str, yours: Collection[str] = ()) -> tuple[pd.DataFrame, str]:
    """The runs an experiment's figures draw, and a phrase saying which: the evaluation
    runs of its newest protocol sweep when it has one, else its trained runs in the
    :data:`MAX_GROUPS` clusters / hardware with the most runs; never the user's runs
    ``yours`` (run ids), which are drawn on their own."""
    runs = inputs.runs
    mine = runs[(runs["experiment"] == exp) & runs["trained"] & ~runs["run_id"].isin(yours)]
    table = protocol_tables(inputs).get(exp)
    if table is not None:
        ev = mine[(mine["sweep_id"] == table.stem) & (mine["protocol_role"] == "eval")]
        # the runs the table counts: a run done again (refused, interrupted, --rerun)
        # draws its latest record, as the table does, not both
        ids = table_run_ids(pd.read_csv(table))
        ev = ev[ev["run_id"].isin(ids)] if ids else ev
        if not ev.empty:
            return ev, f"the evaluation runs of protocol sweep {table.stem}"
    mine = mine[mine["protocol_role"] != "tune"]
    sizes = mine.groupby(["cluster", "hardware"]).size().sort_values(ascending=False)
    keep = set(sizes.index[:MAX_GROUPS])
    left = len(sizes) - len(keep)
    picked = mine[[k in keep for k in zip(mine["cluster"], mine["hardware"], strict=True)]]
    more = f"; {left} smaller group(s) in the records table" if left else ""
    return picked, f"{len(picked)} run(s) in {len(keep)} cluster/hardware group(s){more}"


def _experiment_figures(
    inputs: Inputs, exp: str, stats: pd.DataFrame, yours: Collection[str] = ()
) -> list[Figure]:
    runs, which = figure_runs(inputs, exp, yours)
    all_runs = inputs.runs
    mine = all_runs[
        (all_runs["experiment"] == exp)
        & all_runs["run_id"].isin(yours)
        & all_runs["trained"]
        & all_runs["has_curve"]
    ]
    if runs.empty and mine.empty:
        return []
    res, table, out = inputs.results_dir, protocol_tables(inputs).get(exp), []

    def add(kind: str, what: str, make: Callable[[Path], object]) -> None:
        path = figures_dir(inputs) / f"{kind}_{slug(exp)}.png"
        out.append(Figure(path, f"{exp}: {what}", lambda: make(path), kind, exp))

    curves = bool(runs["has_curve"].sum())
    if curves or not mine.empty:
        what = f"time to accuracy, mean and band over seeds, of {which}"
        tta = runs
        if table is not None:  # the measured column's runs: the local cluster's wall time
            # (loopback links) is no column of the answer, only its runs' steps are
            ids = table_run_ids((t := pd.read_csv(table))[t["ratio"].isna()])
            tta = runs[runs["run_id"].isin(ids)] if runs["run_id"].isin(ids).any() else runs
            if len(tta) < len(runs):
                what += " in the answer's measured column (the local cluster's only give steps)"
        what += f", and your {len(mine)} run(s) on their own" if not mine.empty else ""
        add("tta", what, lambda p: plot_tta(res, tta, exp, p, yours=mine))
    if runs.empty:
        return out
    if table is not None:
        title = f"{exp}: each method's tuned configuration, protocol sweep {table.stem}"
        what = f"speedup over dense and the best peer with 95 % intervals, {table.name}"
        add("speedup", what, lambda p: plot_protocol_speedup(pd.read_csv(table), p, title))
        what = (
            f"speedup against communication / compute ratio, {table.name}'s evaluation runs "
            "composed with the performance model"
        )
        title2 = (
            f"{exp}: time to target across ratios, protocol sweep {table.stem}, each method's "
            f"configuration tuned for `{HEADLINE}`"
        )
        add("ratios", what, lambda p: _ratios_figure(res, table, p, title2))
    elif not speedups(stats[stats["experiment"] == exp]).empty:
        what = f"speedup over dense (mean +- std over seeds), {which}"
        add("speedup", what, lambda p: plot_speedup(config_stats(runs), exp, p, _target(runs)))
    if curves:
        what = f"per-step time by phase, {which}"
        add("breakdown", what, lambda p: plot_breakdown(breakdown_table(res, runs, exp), exp, p))
    return out


def _scaling_figure(inputs: Inputs) -> list[Figure]:
    if not inputs.scaling:
        return []
    p = figures_dir(inputs) / "scaling_efficiency.png"

    def make() -> Path | None:
        return plot_scaling(read_scaling(inputs.scaling), p)

    return [Figure(p, scaling_caption(inputs.scaling), make, "scaling")]


def _bench_figures(inputs: Inputs) -> list[Figure]:
    out = []
    known = set(load_all().names())
    for name, csv in inputs.bench.items():
        if name not in known:
            continue
        for hw, rows in newest_runs(csv, inputs.problems):
            p = figures_dir(inputs) / f"bench_{name}_{slug(hw.split(';')[0])}.png"
            what = (
                f"bench {name}: newest run {rows['bench_id'].iloc[0]} on {hw.split(';')[0]} "
                f"({len(rows)} rows of {csv.name})"
            )
            out.append(Figure(p, what, lambda n=name, r=rows, p=p: replot(n, r, p), "bench", name))
    return out


def plan(
    inputs: Inputs, experiments: list[str] | None = None, yours: Collection[str] = ()
) -> list[Figure]:
    """Every figure the inputs support; with ``experiments``, only theirs (not the scaling
    study's or the benchmarks').  ``yours``: the run ids of a user's runs, drawn on their
    own beside the others (``figures --reference``)."""
    stats = config_stats(inputs.runs)
    exps = sorted(inputs.runs["experiment"].unique())
    out = []
    for exp in exps:
        if experiments is None or exp in experiments:
            out += _experiment_figures(inputs, exp, stats, yours)
    if experiments is not None:
        return out
    return out + _scaling_figure(inputs) + _bench_figures(inputs)


def draw(figs: list[Figure]) -> list[Figure]:
    """Draw each figure; one that fails or has nothing to draw is marked, not fatal."""
    for f in figs:
        try:
            res = f.make()
        except Exception as e:  # noqa: BLE001 - a bad input skips its figure, not the report
            f.error = f"{type(e).__name__}: {e}"
            continue
        if isinstance(res, BenchFigure):
            f.error = res.error
            f.drawn = bool(res.paths) and not res.error
            f.extra = [p for p in res.paths if p != f.path]
        else:
            f.drawn = res is not None
    return figs
