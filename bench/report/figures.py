"""The reproduction's figures, drawn from records and curves alone (nothing is trained).

Per experiment: time-to-accuracy curves of every run (one panel per cluster and hardware,
one colour per configuration), the speedup of each configuration over dense communication
with error bars over seeds, and the per-step time of each method by phase.  Every
function returns the path written, or None when there was nothing to draw.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bench.report.figures_data import CONFIG, GROUP, curve, num, speedups  # noqa: E402
from bench.report.figures_scaling import plot_scaling  # noqa: E402,F401  (drawn from here)
from bench.results.columns import TRAIN_TIME, metric_column  # noqa: E402
from bench.results.plots import (  # noqa: E402
    PHASE_COLOURS,
    fig_width,
    method_colour,
    method_width,
    save_figure,
)

# per-step phases of a curve row: (label, column(s)); the first column present is used
PHASES = (
    ("data wait", ("time/data_s",)),
    ("forward+backward", ("time/compute_s",)),
    ("selection", ("time/select_s",)),
    ("communication", ("comm/exposed_s", "time/exposed_comm_s", "time/comm_s")),
    ("optimizer update", ("time/update_s",)),
)
EXPOSED = ("comm/exposed_s", "time/exposed_comm_s")


def target_text(metric: str, target: float | None) -> str:
    """``93 % top-5``, ``98 % top-1``, ``BLEU 90``: the target as the field says it."""
    name = "BLEU" if metric == "bleu" else metric.replace("top", "top-")
    if target is None:
        return name
    if metric == "bleu":
        return f"BLEU {100 * target:g}"
    return f"{100 * target:g} % {name}"


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


def tta_bands(results_dir: Path, runs: pd.DataFrame) -> dict[str, dict]:
    """Per configuration (its label): the time grid, the median and the min / max over its
    runs of the held-out metric, the runs' median time to target and n (reached of runs)."""
    curves: dict[str, list[pd.DataFrame]] = {}
    meta: dict[str, list] = {}
    for _, r in runs.iterrows():
        df = curve(results_dir, r["run_id"])
        column = metric_column(r["metric"])
        if df is None or column not in df or TRAIN_TIME not in df:
            continue
        evals = r.get("evals")
        if isinstance(evals, list) and evals:  # the sub-epoch points, where the run has them
            ev = pd.DataFrame(evals)
            if {column, TRAIN_TIME} <= set(ev.columns):
                df = pd.concat([df[[TRAIN_TIME, column]], ev[[TRAIN_TIME, column]]])
        d = df.dropna(subset=[column, TRAIN_TIME]).sort_values(TRAIN_TIME)
        if d.empty:
            continue
        name = str(r["comm"])
        curves.setdefault(name, []).append(d.assign(_metric=d[column]))
        meta.setdefault(name, []).append(r)
    if not curves:
        return {}
    t_max = max(float(d[TRAIN_TIME].max()) for ds in curves.values() for d in ds)
    grid = np.linspace(0.0, t_max, GRID_POINTS)
    out = {}
    for name, ds in curves.items():
        vals = np.vstack([_step_values(d, "_metric", grid) for d in ds])
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN before a first eval
            med = np.nanmedian(vals, axis=0)
            lo, hi = np.nanmin(vals, axis=0), np.nanmax(vals, axis=0)
        rs = meta[name]
        tts = [float(r["time_to_target_s"]) for r in rs if r["reached"]]
        out[name] = {
            "grid": grid,
            "median": med,
            "low": lo,
            "high": hi,
            "n": len(rs),
            "n_reached": len(tts),
            "tt_median": float(np.median(tts)) if tts else None,
            "comm_name": str(rs[0]["comm_name"]),
        }
    return out


def plot_tta(
    results_dir: Path, runs: pd.DataFrame, experiment: str, path: Path, title: str = ""
) -> Path | None:
    """Held-out target metric against training time: per configuration the median over its
    runs (seeds) and the band from their lowest to highest, one panel per cluster and
    hardware; a star at the median time to target."""
    runs = runs[(runs["experiment"] == experiment) & runs["has_curve"] & runs["trained"]]
    if runs.empty:
        return None
    groups = list(runs.groupby(["cluster", "hardware"], sort=True))
    most = max(g["comm"].nunique() for _, g in groups)
    fig, axes = _panels(len(groups), w=6.4, h=4.2 + 0.17 * most)
    for ax, ((cluster, hw), g) in zip(axes, groups, strict=True):
        r0 = g.iloc[0]
        styles: dict[str, int] = {}  # configurations of one method: one colour, other dashes
        for name, b in sorted(tta_bands(results_dir, g).items()):
            colour, lw = method_colour(b["comm_name"]), method_width(b["comm_name"])
            ls = LINE_STYLES[styles.setdefault(b["comm_name"], 0) % len(LINE_STYLES)]
            styles[b["comm_name"]] += 1
            label = f"{name} (n = {b['n']}, {b['n_reached']} reached)"
            ax.plot(b["grid"], b["median"], color=colour, lw=lw, ls=ls, label=label)
            ax.fill_between(b["grid"], b["low"], b["high"], color=colour, alpha=0.12, lw=0)
            if b["tt_median"] is not None and r0["target"] is not None:
                ax.plot([b["tt_median"]], [100 * r0["target"]], "*", ms=11, color=colour)
        if r0["target"] is not None:
            ax.axhline(100 * r0["target"], color="k", ls="--", lw=0.8)
            low = 0.0 if r0["metric"] == "bleu" else max(0.0, 100 * r0["target"] - 40)
            ax.set_ylim(low, 100.5)  # BLEU starts near 0: the whole climb
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
        "line: median over seeds; band: lowest to highest seed; star: median time to target",
        fontsize=10,
    )
    return save_figure(fig, path)


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


def step_phases(df: pd.DataFrame) -> dict[str, float] | None:
    """Mean seconds per step of each phase over a curve's epochs.  Forward+backward is the
    loop's compute time less the selection and communication measured inside the hook
    (which run within the backward pass); None when the curve has no phase columns."""
    if "time/compute_s" not in df:
        return None
    out = {}
    for label, cols in PHASES:
        col = next((c for c in cols if c in df), None)
        out[label] = float(df[col].mean()) if col is not None else 0.0
    inner = out["selection"] + out["communication"]
    out["forward+backward"] = max(0.0, out["forward+backward"] - inner)
    return {k: (0.0 if v != v else v) for k, v in out.items()}


def breakdown_table(results_dir: Path, runs: pd.DataFrame, experiment: str) -> pd.DataFrame:
    """Mean per-step phase times (ms) per group and configuration, over its runs' curves."""
    rows = []
    for _, r in runs[(runs["experiment"] == experiment) & runs["has_curve"]].iterrows():
        df = curve(results_dir, r["run_id"])
        ph = step_phases(df) if df is not None else None
        if ph:
            exposed = any(c in df for c in EXPOSED)
            rows.append({**{k: r[k] for k in GROUP + CONFIG}, **ph, "exposed": exposed})
    if not rows:
        return pd.DataFrame()
    t = pd.DataFrame(rows)
    return t.groupby(GROUP + CONFIG, sort=True).mean(numeric_only=False).reset_index()


def plot_breakdown(table: pd.DataFrame, experiment: str, path: Path) -> Path | None:
    """Stacked per-step time (ms) by phase, one horizontal bar per configuration, one
    panel per cluster and hardware, one legend for the figure."""
    if table.empty:
        return None
    groups = list(table.groupby(["cluster", "hardware"], sort=True))
    most = int(table.groupby(["cluster", "hardware"]).size().max())
    fig, axes = _panels(
        len(groups), w=8.5 if len(groups) == 1 else 6.0, h=max(3.2, 1.6 + 0.32 * most)
    )
    for ax, ((cluster, hw), g) in zip(axes, groups, strict=True):
        left = np.zeros(len(g))
        for label, _ in PHASES:
            vals = 1e3 * g[label].to_numpy(dtype=float)
            ax.barh(range(len(g)), vals, left=left, color=PHASE_COLOURS[label], label=label)
            left = left + vals
        ax.set_yticks(range(len(g)), [config_name(r) for _, r in g.iterrows()], fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("ms per training step (mean over epochs)")
        ax.set_title(f"{cluster}\n{hw}", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    exposed = bool(table["exposed"].all())
    note = (
        "exposed communication"
        if exposed
        else "communication time measured in the hook, not exposed"
    )
    h, labels = axes[0].get_legend_handles_labels()
    fig.legend(h, labels, loc="lower center", ncol=len(PHASES), fontsize=8, frameon=False)
    fig.suptitle(f"{experiment}: per-step time by phase ({note})", fontsize=10)
    h_in = fig.get_figheight()
    fig.tight_layout(rect=(0, 0.6 / h_in, 1, 1 - 0.35 / h_in))
    return save_figure(fig, path, layout=False)
