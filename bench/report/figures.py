"""The report's figures, drawn from records, curves and CSVs alone (nothing is trained).

:func:`plan` lists every figure the inputs support, :func:`draw` draws them: per
experiment the time-to-accuracy bands over seeds, the speedup over dense (with 95 %
intervals from a protocol sweep), the composition across communication / compute ratios
and the per-step breakdown; the scaling study; each benchmark's own figure.
"""

from __future__ import annotations

import json
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
from matplotlib.lines import Line2D  # noqa: E402
from scipy import stats  # noqa: E402

from bench.benchmarks import load_all  # noqa: E402
from bench.benchmarks.harness import BenchRun  # noqa: E402
from bench.report.tables import (  # noqa: E402
    CONFIG,
    GROUP,
    Inputs,
    cluster_title,
    config_stats,
    curve,
    num,
    protocol_tables,
    scaling_caption,
    speedups,
    target_text,
)
from bench.results.columns import TRAIN_TIME, metric_column, newer_scaling  # noqa: E402
from bench.results.plots import (  # noqa: E402
    PAPER_METHODS,
    PHASE_COLOURS,
    fig_width,
    method_colour,
    method_width,
    save_figure,
)
from bench.sweeps import ratios  # noqa: E402
from bench.sweeps.intervals import ci_text, mean_interval  # noqa: E402
from bench.sweeps.methods import method_of  # noqa: E402

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


def _panels(n: int, w: float = 6.0, h: float = 4.2, extra: float = 0.0):
    """``n`` panels in rows of at most :data:`PER_ROW`, the figure capped in width."""
    cols = min(n, PER_ROW)
    rows = -(-n // cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(fig_width(cols, w, extra), h * rows), squeeze=False
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
    """Per method (its :func:`~bench.sweeps.methods.method_of` name): the time grid, the
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
        name = method_of(r)
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
        base = str(rs[0]["comm_name"]) if name == str(rs[0]["comm"]) else name
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
            "label": f"{base} {trial}" if trial else str(rs[0]["comm"]),
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
    panel per cluster and hardware; a star at the mean time to target with its interval.
    ``yours``: a user's runs, each drawn on its own over the panel of its cluster and
    hardware (else of its cluster, else the first)."""
    pick = (runs["experiment"] == experiment) & runs["has_curve"] & runs["trained"]
    runs = runs[pick]
    yours = yours if yours is not None and not yours.empty else None
    if runs.empty and yours is None:
        return None
    groups = list((runs if not runs.empty else yours).groupby(["cluster", "hardware"], sort=True))
    most = max(g["comm"].nunique() for _, g in groups)
    fig, axes = _panels(len(groups), w=6.4, h=4.2 + 0.17 * most)
    for ax, ((cluster, hw), g) in zip(axes, groups, strict=True):
        r0 = g.iloc[0]
        styles: dict[str, int] = {}  # configurations of one method: one colour, other dashes
        bands = tta_bands(results_dir, g)
        for _, b in sorted(bands.items()):
            colour, lw = method_colour(b["comm_name"]), method_width(b["comm_name"])
            ls = LINE_STYLES[styles.setdefault(b["comm_name"], 0) % len(LINE_STYLES)]
            styles[b["comm_name"]] += 1
            label = f"{b['label']} (n = {b['n']}, {b['n_reached']} reached)"
            ax.plot(b["grid"], b["mean"], color=colour, lw=lw, ls=ls, label=label)
            ax.fill_between(b["grid"], b["low"], b["high"], color=colour, alpha=0.1, lw=0)
            if b["tt_mean"] is not None and r0["target"] is not None:
                lo, hi = b["tt_low"], b["tt_high"]
                err = [[b["tt_mean"] - lo], [hi - b["tt_mean"]]] if lo == lo else None
                ax.errorbar([b["tt_mean"]], [100 * r0["target"]], xerr=err, fmt="*", ms=11,
                            color=colour, capsize=3, lw=1.2, zorder=4)  # fmt: skip
        if r0["target"] is not None:
            ax.axhline(100 * r0["target"], color="k", ls="--", lw=0.8)
        drawn = [np.nanmin(b["low"] if np.isfinite(b["low"]).any() else b["mean"])
                 for b in bands.values() if np.isfinite(b["mean"]).any()]  # fmt: skip
        low = 0.0 if r0["metric"] == "bleu" or not drawn else max(0.0, min(drawn) - 2.0)
        ax.set_ylim(10 * np.floor(low / 10), 100.5)  # every drawn curve and band, whole
        ax.set_xlim(left=0)  # the time from the start, before the first evaluation too
        if yours is not None:
            _draw_yours(ax, results_dir, yours, (cluster, hw), [k for k, _ in groups])
        ax.set_title(f"{cluster}\n{hw}", fontsize=9)
        ax.set_xlabel("training time (s, evaluation excluded)")
        ax.set_ylabel(f"held-out {target_text(r0['metric'], None)} (%)")
        ax.grid(alpha=0.3)
        ax.legend(  # below the panel: it covers no data
            loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=7, frameon=False
        )
    fig.suptitle(
        title
        or f"{experiment}: time to {target_text(r0['metric'], r0['target'])} (dashed)\n"
        "line: mean over seeds from when every seed has an evaluation; band: its 95 % "
        "t-interval;\nstar: mean time to target with its 95 % bootstrap interval (as the tables)",
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
        colour = method_colour(str(r["comm_name"]))
        where = [str(k).split(";")[0] for k, p in zip(key, panel, strict=True) if k != p]
        label = f"yours: {r['run_id']} {method_of(r)}" + (f" ({', '.join(where)})" * bool(where))
        ax.plot(d[TRAIN_TIME], 100 * d["_metric"], color=colour, ls="--", lw=1.6, marker="D",
                ms=4, mfc="white", zorder=5, label=label)  # fmt: skip
        if r["reached"] and r["target"] is not None:
            ax.plot([r["time_to_target_s"]], [100 * r["target"]], marker="X", ms=10,
                    color=colour, mec="k", ls="none", zorder=6)  # fmt: skip


def plot_speedup(
    stats: pd.DataFrame, experiment: str, path: Path, target: str = "target"
) -> Path | None:
    """Time-to-target speedup over dense per configuration (mean over seeds, error bar one
    standard deviation), one panel per cluster and hardware that has a dense baseline.
    Configurations that missed the target in every run are shown at 0 with their count.
    Used where no protocol sweep gives intervals (:func:`plot_protocol_speedup`)."""
    sp = speedups(stats[stats["experiment"] == experiment], "comm", "dense")
    if sp.empty:
        return None
    groups = list(sp.groupby(["cluster", "hardware"], sort=True))
    most = int(sp.groupby(["cluster", "hardware"]).size().max())
    fig, axes = _panels(len(groups), w=max(5.0, 0.9 * most), h=4.6)
    for ax, ((cluster, hw), g) in zip(axes, groups, strict=True):
        labels = [config_name(r) for _, r in g.iterrows()]
        heights = [num(s) or 0.0 for s in g["speedup"]]
        errs = [num(s) or 0.0 for s in g["speedup_std"]]
        colours = [method_colour(c) for c in g["comm_name"]]
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


#: methods whose exchange runs in the optimizer step, not in the backward pass's hook
EXCHANGE_IN_UPDATE = ("demo",)


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
        inside = str(r.get("comm_name")) in EXCHANGE_IN_UPDATE
        ph = step_phases(df, inside) if df is not None else None
        if ph:
            exposed = any(c in df for c in EXPOSED)
            trial = str(r.get("protocol_trial") or "")
            label = f"{r['comm_name']} {trial}" if trial else str(r["comm"])
            if inside and not df.get("time/comm_s", pd.Series([0.0])).any():  # not timed yet
                label += " (update holds its all-gather)"
            rows.append(
                {**{k: r[k] for k in GROUP + CONFIG}, **ph, "exposed": exposed, "label": label}
            )
    if not rows:
        return pd.DataFrame()
    t = pd.DataFrame(rows)
    keys = GROUP + CONFIG
    out = t.groupby(keys, sort=True)[[p for p, _ in PHASES]].mean()
    out["exposed"] = t.groupby(keys, sort=True)["exposed"].all()
    out["label"] = t.groupby(keys, sort=True)["label"].first()
    out["n"] = t.groupby(keys, sort=True).size()
    return out.reset_index()


def plot_breakdown(table: pd.DataFrame, experiment: str, path: Path) -> Path | None:
    """Stacked per-step time (ms) by phase, one horizontal bar per configuration (its
    label and n runs; the settings common to the panel in its title), one panel per
    cluster and hardware, one legend for the figure."""
    if table.empty:
        return None
    groups = list(table.groupby(["cluster", "hardware"], sort=True))
    most = int(table.groupby(["cluster", "hardware"]).size().max())
    fig, axes = _panels(len(groups), w=7.0, h=2.3 + 0.3 * most)
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
        for t, c in zip(ax.get_yticklabels(), g["comm"], strict=True):
            t.set_color(method_colour(c))  # the method's colour: the bars are the phases'
        ax.invert_yaxis()
        ax.set_xlabel("ms per training step (mean over epochs and runs)")
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


def plan_of(table: Path) -> dict[str, Any]:
    """The sweep's plan (``<sweep_id>.plan.json`` beside its table)."""
    return json.loads(table.with_name(f"{table.stem}.plan.json").read_text())


def _speedup_blocks(df: pd.DataFrame) -> list[tuple[str, str, pd.DataFrame]]:
    """(heading, best peer, rows) per block of a protocol table: one block per cluster a
    v2 table quotes (its rows by speedup over dense), or the whole v1 table (by time)."""

    def peer(g: pd.DataFrame) -> str:
        named = g["best_peer"].dropna().astype(str)
        named = named[named != ""]
        return str(named.iloc[0]) if len(named) else "peer"

    if "for_cluster" not in df:
        g = df.sort_values("time_to_target_mean_s")
        return [("", peer(g), g)]
    out = []
    for cluster, g in df.groupby("for_cluster", sort=False):
        ratio = float(g["ratio"].iloc[0])
        g = g.sort_values("speedup_vs_dense", ascending=False, na_position="first")
        out.append((cluster_title(str(cluster), ratio), peer(g), g))
    return out


def plot_protocol_speedup(df: pd.DataFrame, path: Path, title: str) -> Path | None:
    """Two panels: speedup over dense and over the best peer, one row per method (its
    selected trial), point = ratio of times, bar = 95 % interval, the verdict written
    beside it.  A v2 table quotes each method tuned per cluster: one block of rows per
    cluster under its heading, each against that cluster's dense and best peer."""
    if df.empty or "speedup_vs_dense" not in df:
        return None
    v2 = "for_cluster" in df
    blocks = _speedup_blocks(df)
    rows: list[tuple[float, pd.Series, str]] = []  # (y, row, the block's peer)
    heads: list[tuple[float, str]] = []
    y = 0.0
    for head, peer, g in blocks:
        if head:
            heads.append((y, f"{head}; best peer {peer}"))
            y += 1
        for _, r in g.iterrows():
            rows.append((y, r, peer))
            y += 1
        y += 0.4
    height = 1.7 + 0.36 * y
    fig, axes = plt.subplots(1, 2, figsize=(fig_width(2, 6.2), height), sharey=True)
    right = "its cluster's best peer" if v2 else f"the best peer, {blocks[0][1]}"
    n_seeds = int(df["n_runs"].max())
    for ax, (key, label) in zip(
        axes, (("speedup_vs_dense", "dense DDP"), ("speedup_vs_peer", right)), strict=True
    ):
        for i, r, peer in rows:
            m, lo, hi = r[key], r[f"{key}_ci_low"], r[f"{key}_ci_high"]
            itself = r["comm"] == ("dense" if key == "speedup_vs_dense" else peer)
            if itself:
                ax.annotate("the baseline", (1.0, i), xytext=(6, 0), textcoords="offset points",
                            va="center", fontsize=7)  # fmt: skip
                continue
            if m != m:
                continue
            colour = method_colour(r["comm"])
            paper = r["comm"] in PAPER_METHODS
            err = [[max(0.0, m - lo)], [max(0.0, hi - m)]] if lo == lo else None
            style = {"ms": 8, "lw": 2.2} if paper else {"ms": 6, "lw": 1.4}
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
        t.set_color(method_colour(r["comm"]))
        if r["comm"] in PAPER_METHODS:
            t.set_fontweight("bold")
    how = (
        "point: geometric-mean ratio of times to target (a miss: its whole run); bar: 95 % "
        f"Welch interval on log time over {n_seeds} evaluation seeds"
        if v2
        else "point: ratio of mean times to target; bar: 95 % bootstrap interval over "
        "evaluation seeds"
    )
    how += "; (k/n): seeds that reached the target"
    fig.suptitle(f"{title}\n{how}", fontsize=9)
    return save_figure(fig, path)


HEADLINE = "paper"  # the cluster whose tuned configurations a v2 sweep's ratio figure draws


def table_run_ids(table: pd.DataFrame) -> set[str]:
    """The run ids a sweep table counts (its ``run_ids`` column; empty without one)."""
    if "run_ids" not in table:
        return set()
    return {i for v in table["run_ids"].dropna() for i in str(v).replace(",", " ").split()}


def ratio_runs(results_dir: Path, table: pd.DataFrame) -> list:
    """The sweep's evaluation runs as :class:`bench.sweeps.ratios.Run` (grouped by method),
    the runs the composition uses (a v2 sweep's: each method's configuration tuned for
    :data:`HEADLINE`, since a method's runs of several configurations do not average to one
    curve); ``[]`` when none has step counts."""
    sweep = str(table["sweep_id"].iloc[0])
    if "for_cluster" in table and (table["for_cluster"] == HEADLINE).any():
        table = table[table["for_cluster"] == HEADLINE]  # v2: one configuration per method
    ids = table_run_ids(table)

    def select(r: Mapping[str, Any]) -> bool:
        res = (r.get("config") or {}).get("results") or {}
        return res.get("sweep_id") == sweep and (not ids or r.get("run_id") in ids)

    runs, _ = ratios.load_runs(results_dir, select, group=method_of)
    return runs


def ratios_table(results_dir: Path, table: pd.DataFrame, n_boot: int = 2000) -> pd.DataFrame:
    """The composition (:func:`bench.sweeps.ratios.compose`) of the sweep's evaluation
    runs on the ratio grid and at the named settings; empty when it cannot be made."""
    runs = ratio_runs(results_dir, table)
    if not runs or "dense" not in {r.group for r in runs}:
        return pd.DataFrame()
    named = ratios.named_ratios()
    grid = sorted(set(ratios.GRID) | set(named.values()))
    return ratios.compose(runs, grid, n_boot=n_boot)


INVALID_ABOVE = 1.05  # efficiency above this: the compute-only reference is at fault
REFERENCE = "nocomm"  # the compute-only runs: efficiency 1 by definition, not drawn


def newest_sweep(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the scaling study to draw: of the sweeps with predictions (else of
    all), the one that measured the most methods, then the most sizes, the newest among
    equals (sweep ids sort by start time), so that a narrower check run later does not
    hide the study it checks (:func:`later_checks`); an older table's columns read as
    today's."""
    df = newer_scaling(frame)
    ids = _sweeps_by_breadth(df)
    return df if not ids else df[df["sweep_id"].astype(str) == ids[-1]]


def later_checks(frame: pd.DataFrame) -> list[pd.DataFrame]:
    """The sweeps with predictions newer than :func:`newest_sweep`'s, each a narrower
    study of its own (the rows of each, oldest first)."""
    df = newer_scaling(frame)
    ids = _sweeps_by_breadth(df)
    if not ids or "predicted_step_s" not in df.columns:
        return []
    main = ids[-1]
    new = df[df["predicted_step_s"].notna()]
    later = sorted(x for x in new["sweep_id"].dropna().astype(str).unique() if x > main)
    return [df[df["sweep_id"].astype(str) == x] for x in later]


def _sweeps_by_breadth(df: pd.DataFrame) -> list[str]:
    """Sweep ids (with predictions where any has them) by (methods measured, sizes,
    id), the study to draw last; [] where the rows name no sweep."""
    if "sweep_id" not in df.columns or df["sweep_id"].isna().all():
        return []
    new = df[df["predicted_step_s"].notna()] if "predicted_step_s" in df.columns else df[:0]
    pool = new if len(new) else df
    pool = pool[pool["sweep_id"].notna()].astype({"sweep_id": str})

    def breadth(sweep: str) -> tuple[int, int, str]:
        g = pool[(pool["sweep_id"] == sweep) & (pool["comm"] != REFERENCE)]
        if "kind" in g.columns:
            g = g[g["kind"].fillna("measured") == "measured"]
        sizes = {tuple(x) for x in g[["nodes", "workers_per_node"]].itertuples(index=False)}
        return g["comm"].nunique(), len(sizes), sweep

    return sorted(pool["sweep_id"].unique(), key=breadth)


def _measured(ax, meas: pd.DataFrame, colours: dict[str, str]) -> None:
    """One line per method (each point one run), the model's prediction for the same size
    as hollow markers without a line: the lines are the measurements alone.  One marker
    shape in every panel (each panel is one number of workers per node), the legend's."""
    for comm, g in meas.groupby("comm", sort=True):
        g = g.sort_values("nodes")
        ax.plot(g["nodes"], g["efficiency"], "-", marker="o", color=colours[comm],
                lw=method_width(comm))  # fmt: skip
        if "predicted_efficiency" in g.columns and g["predicted_efficiency"].notna().any():
            ax.plot(g["nodes"], g["predicted_efficiency"], ls="", marker="o", mfc="none",
                    ms=8, color=colours[comm], alpha=0.8)  # fmt: skip


def _projected(ax, proj: pd.DataFrame, colours: dict[str, str]) -> None:
    for comm, g in proj.groupby("comm", sort=True):
        g = g.sort_values("nodes")
        ax.plot(g["nodes"], g["efficiency"], "--", marker=".", color=colours[comm])
        if {"efficiency_min", "efficiency_max"} <= set(g.columns):
            if g["efficiency_min"].notna().all():
                ax.fill_between(g["nodes"], g["efficiency_min"], g["efficiency_max"],
                                color=colours[comm], alpha=0.12)  # fmt: skip


def _holds(proj: pd.DataFrame) -> bool:
    if proj.empty or "model_holds" not in proj.columns:
        return False
    v = proj["model_holds"].dropna()
    return bool(len(v)) and bool(v.astype(str).str.lower().isin(["true", "1", "1.0"]).all())


def _worst(meas: pd.DataFrame) -> str:
    if "model_error" not in meas.columns or meas["model_error"].dropna().empty:
        return "this sweep has no prediction to check the model against"
    r = meas.loc[meas["model_error"].abs().idxmax()]
    return (
        f"the model missed {r['comm']} on {int(r['nodes'])}x{int(r['workers_per_node'])} "
        f"by {r['model_error']:+.0%}"
    )


def _off_scale(over: pd.DataFrame) -> str:
    """The note naming the points not drawn: efficiency above :data:`INVALID_ABOVE`."""
    sizes = ", ".join(
        sorted(
            {
                f"{r['comm']} at {int(r['nodes'])}x{int(r['workers_per_node'])} "
                f"({r['efficiency']:.2f})"
                for _, r in over.iterrows()
            }
        )
    )
    return (
        f"not drawn, above {INVALID_ABOVE:g}:\n{sizes};\ntheir compute-only runs were slower "
        "than runs that communicate:\na measurement fault, not an efficiency"
    )


def plot_scaling(frame: pd.DataFrame, path: Path) -> Path | None:
    """Efficiency against nodes of the newest sweep in ``frame`` (its CSV's rows): one
    panel per workers-per-node measured on this machine, and the model's projection to
    the paper's cluster in its own panel on its own axis."""
    need = {"efficiency", "comm"}
    if frame.empty or not need <= set(frame.columns):
        return None
    df = newest_sweep(frame)
    kind = df["kind"] if "kind" in df.columns else pd.Series("measured", index=df.index)
    meas = df[(kind == "measured") & (df["comm"] != REFERENCE)].dropna(subset=["efficiency"])
    proj = df[kind == "projected"]
    if meas.empty and proj.empty:
        return None
    if "workers_per_node" not in meas.columns:
        meas = meas.assign(workers_per_node=1)
    comms = list(dict.fromkeys([*meas["comm"], *proj["comm"]]))
    colours = {c: method_colour(c) for c in comms}  # the suite's one palette
    over = meas[meas["efficiency"] > INVALID_ABOVE]
    shown = meas[meas["efficiency"] <= INVALID_ABOVE]
    pers = sorted({int(p) for p in meas["workers_per_node"].dropna()}) or [1]
    fig, axes = plt.subplots(
        1, len(pers) + 1, figsize=(fig_width(len(pers) + 1, 5.2), 6.4), squeeze=False
    )
    axes = list(axes[0])
    cluster = ", ".join(sorted(meas["cluster"].dropna().astype(str).unique())) or "?"
    steps = ""
    if "measured_steps" in meas.columns and meas["measured_steps"].notna().any():
        steps = f", its step time the median of {int(meas['measured_steps'].median())} steps"
    for ax, per in zip(axes, pers, strict=False):
        rows = shown[shown["workers_per_node"] == per]
        _measured(ax, rows, colours)
        ax.set_title(f"measured on this machine: {per} worker(s) per node", fontsize=9)
        ax.set_xlabel(f"nodes ({cluster}; log 2)")
        ax.set_ylim(0, 1.1)
        ticks = sorted({int(n) for n in meas["nodes"].dropna()})
        ax.set_xscale("log", base=2)
        if ticks:  # the node counts themselves, not powers of 2
            ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("scaling efficiency (compute-only step / step, ratio)")
    right = axes[-1]
    drawn = _holds(proj)
    if drawn:
        _projected(right, proj, colours)
        ticks = sorted({int(n) for n in proj["nodes"].dropna()})
        right.set_xscale("log", base=2)
        if ticks:
            right.set_xticks(ticks, [str(t) for t in ticks])
    else:
        why = "no projection in this table" if proj.empty else _worst(meas)
        right.text(0.5, 0.5, f"projection not drawn:\n{why}", ha="center", va="center",
                   transform=right.transAxes, fontsize=9, wrap=True)  # fmt: skip
        right.set_xticks([])
    right.set_ylim(0, 1.1)
    right.grid(alpha=0.3)
    right.set_title("projected: the model, not a measurement", fontsize=9)
    right.set_xlabel("nodes of 8 V100 at 25 Gbit/s (model; log 2)")
    right.set_ylabel("projected scaling efficiency (ratio)")
    handles = [Line2D([], [], color=colours[c], lw=method_width(c), label=c) for c in comms]
    handles += [
        Line2D([], [], color="k", ls="-", marker="o", label="measured: one run a point (n = 1)"),
        Line2D([], [], color="k", ls="", marker="o", mfc="none", ms=8,
               label="model's prediction for that size"),
    ]  # fmt: skip
    if drawn:
        handles.append(Line2D([], [], color="k", ls="--", label="projected (band: assumptions)"))
    # one legend, below the last panel, and the points left out named below the first:
    # tight_layout makes room for both (an axes' legend and text)
    right.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2,
                 fontsize=8, frameon=False)  # fmt: skip
    if len(over):  # a compute-only run slower than a communicating one: a fault, say it
        axes[0].text(0.0, -0.13, _off_scale(over), transform=axes[0].transAxes, fontsize=8,
                     color="firebrick", va="top", wrap=True)  # fmt: skip
    sweep = str(df["sweep_id"].iloc[0]) if "sweep_id" in df.columns and len(df) else ""
    fig.suptitle(
        f"Scaling efficiency against nodes per method, sweep {sweep}\neach measured point is "
        f"one run (n = 1, no interval){steps}; the projection has its own axis",
        fontsize=10,
    )
    return save_figure(fig, path)


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
        what = f"time to accuracy, median and band over seeds, of {which}"
        what += f", and your {len(mine)} run(s) on their own" if not mine.empty else ""
        add("tta", what, lambda p: plot_tta(res, runs, exp, p, yours=mine))
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
        title2 = f"{exp}: time to target across ratios, protocol sweep {table.stem}"
        if "for_cluster" in pd.read_csv(table, nrows=0).columns:  # v2, as ratio_runs reads it
            title2 += f", each method's configuration tuned for `{HEADLINE}`"
        add("ratios", what, lambda p: _ratios_figure(res, table, p, title2))
    elif not speedups(stats[stats["experiment"] == exp], "comm", "dense").empty:
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
        frames = [pd.read_csv(f) for f in inputs.scaling]
        return plot_scaling(pd.concat(frames, ignore_index=True, sort=False), p)

    return [Figure(p, scaling_caption(inputs.scaling, newest_sweep), make, "scaling")]


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
