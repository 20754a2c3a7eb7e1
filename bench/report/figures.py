"""The reproduction's figures, drawn from records and curves alone (nothing is trained).

Per experiment: time-to-accuracy curves of every run (one panel per cluster and hardware,
one colour per configuration), the speedup of each configuration over dense communication
with error bars over seeds, and the per-step time of each method by phase.  Every
function returns the path written, or None when there was nothing to draw.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from bench.report.figures_data import CONFIG, GROUP, curve, num, speedups  # noqa: E402
from bench.report.figures_scaling import plot_scaling  # noqa: E402,F401  (drawn from here)
from bench.results.columns import TRAIN_TIME, metric_column  # noqa: E402
from bench.results.plots import save_figure  # noqa: E402

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


def _panels(n: int, w: float = 6.0, h: float = 4.2):
    fig, axes = plt.subplots(1, n, figsize=(w * n, h), squeeze=False)
    return fig, list(axes[0])


def plot_tta(results_dir: Path, runs: pd.DataFrame, experiment: str, path: Path) -> Path | None:
    """Held-out target metric against training time, one panel per cluster and hardware."""
    runs = runs[(runs["experiment"] == experiment) & runs["has_curve"]]
    if runs.empty:
        return None
    groups = list(runs.groupby(["cluster", "hardware"], sort=True))
    fig, axes = _panels(len(groups))
    for ax, ((cluster, hw), g) in zip(axes, groups, strict=True):
        colours = {
            c: f"C{i}" for i, c in enumerate(sorted({config_name(r) for _, r in g.iterrows()}))
        }
        for _, r in g.iterrows():
            _tta_line(ax, results_dir, r, colours[config_name(r)])
        r0 = g.iloc[0]
        if r0["target"] is not None:
            ax.axhline(100 * r0["target"], color="k", ls="--", lw=1)
        ax.set_title(
            f"time to {target_text(r0['metric'], r0['target'])}\n{cluster} on {hw}", fontsize=9
        )
        target = target_text(r0["metric"], r0["target"])
        ax.set_xlabel(f"training time (s, evaluation excluded); * = time to {target}")
        ax.set_ylabel(f"held-out {target_text(r0['metric'], None)} (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{experiment}: time to accuracy (comm / cache / update); * = target reached", fontsize=10
    )
    return save_figure(fig, path)


def _tta_line(ax, results_dir: Path, r, colour: str) -> None:
    df = curve(results_dir, r["run_id"])
    column = metric_column(r["metric"])
    if df is None or column not in df or TRAIN_TIME not in df:
        return
    d = df.dropna(subset=[column, TRAIN_TIME])
    seed = f" seed {r['seed']}," if r["seed"] is not None else ""
    label = f"{config_name(r)}{seed} {r['run_id'][-6:]}" + (
        "" if r["reached"] else f" ({r['status']})"
    )
    ax.plot(d[TRAIN_TIME], 100 * d[column], "-o", ms=3, color=colour, label=label)
    if r["reached"]:
        hit = d[d[TRAIN_TIME] >= r["time_to_target_s"] - 1e-9].head(1)
        ax.plot(hit[TRAIN_TIME], 100 * hit[column], "*", ms=12, color=colour)


def plot_speedup(
    stats: pd.DataFrame, experiment: str, path: Path, target: str = "target"
) -> Path | None:
    """Time-to-target speedup over dense per configuration (mean over seeds, error bar one
    standard deviation), one panel per cluster and hardware that has a dense baseline.
    Configurations that missed the target in every run are shown at 0 with their count."""
    sp = speedups(stats[stats["experiment"] == experiment], "comm", "dense")
    if sp.empty:
        return None
    groups = list(sp.groupby(["cluster", "hardware"], sort=True))
    fig, axes = _panels(
        len(groups), w=max(6.5, 1.2 * sp.groupby(["cluster", "hardware"]).size().max())
    )
    for ax, ((cluster, hw), g) in zip(axes, groups, strict=True):
        labels = [config_name(r) for _, r in g.iterrows()]
        heights = [num(s) or 0.0 for s in g["speedup"]]
        errs = [num(s) or 0.0 for s in g["speedup_std"]]
        ax.bar(range(len(g)), heights, yerr=errs, capsize=4, color="C0")
        for i, (_, r) in enumerate(g.iterrows()):
            txt = f"{r['n_reached']}/{r['n_runs']} reached"
            ax.text(i, heights[i], txt, ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="k", lw=1, ls="--")
        ax.set_xticks(range(len(g)), labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(f"speedup in time to {target} over dense (x)")
        ax.set_title(f"{cluster} on {hw}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{experiment}: speedup over dense DDP\n(mean +- std over seeds)", fontsize=10)
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
    """Stacked per-step time (ms) by phase, one bar per configuration."""
    if table.empty:
        return None
    groups = list(table.groupby(["cluster", "hardware"], sort=True))
    fig, axes = _panels(
        len(groups), w=max(5.0, 1.4 * table.groupby(["cluster", "hardware"]).size().max())
    )
    for ax, ((cluster, hw), g) in zip(axes, groups, strict=True):
        bottom = [0.0] * len(g)
        for i, (label, _) in enumerate(PHASES):
            vals = [1e3 * v for v in g[label]]
            ax.bar(range(len(g)), vals, bottom=bottom, color=f"C{i}", label=label)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xticks(
            range(len(g)),
            [config_name(r) for _, r in g.iterrows()],
            rotation=30,
            ha="right",
            fontsize=7,
        )
        ax.set_ylabel("ms per training step (mean over epochs)")
        ax.set_title(f"{cluster} on {hw}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    exposed = bool(table["exposed"].all())
    note = (
        "exposed communication"
        if exposed
        else "communication time measured in the hook, not exposed"
    )
    fig.suptitle(f"{experiment}: per-step time by phase ({note})", fontsize=10)
    return save_figure(fig, path)
