"""Figures drawn from result records and curves alone (no rerun needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from bench.results.columns import EPOCH, RENAMES, TRAIN_TIME, metric_column  # noqa: E402

TIME_LABEL = "training time (s, evaluation excluded)"
MAX_WIDTH_PX = 2400  # no figure of the suite is wider (at DPI); tests check it
DPI = 120

# one colour per communication method in every figure of the suite; the paper's methods
# (hitopk, mstopk) in warm, saturated colours and drawn thicker, the peers in cool ones
METHOD_COLOURS = {
    "dense": "#555555",
    "fp16": "#1f77b4",
    "bf16": "#17becf",
    "powersgd": "#2ca02c",
    "topk": "#9467bd",
    "randomk": "#8c564b",
    "mstopk": "#ff7f0e",
    "hitopk": "#d62728",
    "nocomm": "#bbbbbb",
}
PAPER_METHODS = ("hitopk", "mstopk")
# the per-step phases of a breakdown, in stacking order, each its own colour
PHASE_COLOURS = {
    "data wait": "#c7c7c7",
    "forward+backward": "#6b8fb5",
    "selection": "#f2b134",
    "communication": "#c0392b",
    "optimizer update": "#7fb17f",
}
# the benchmark figures' other categories: optimizer update modes, top-k selectors (the
# read floor, the baseline, mstopk's methods), input caches, and quantities side by side
UPDATE_COLOURS = {
    "naive": "#999999",
    "foreach": "#4c72b0",
    "fused": "#dd8452",
    "flat": "#55a868",
    "other": "#8172b3",
}
SELECTION_COLOURS = {
    "sum": "#000000",
    "torch.topk": "#d62728",
    "tiled": "#ff7f0e",
    "paper": "#1f77b4",
    "sampled": "#2ca02c",
    "hist": "#9467bd",
    "other": "#8c564b",
}
CACHE_COLOURS = {
    "none": "#7f7f7f",
    "disk": "#1f77b4",
    "memory": "#2ca02c",
    "multilevel": "#d62728",
    "predecoded": "#9467bd",
    "other": "#8c564b",
}
BENCH_COLOURS = {
    "measured": "#1f77b4",
    "model": "#ff7f0e",
    "total": "#7f7f7f",
    "inter-node": "#ff7f0e",
    "alone": "#7f7f7f",
    "exposed": "#d62728",
    "images": "#4c72b0",
    "tokens": "#dd8452",
    "reference": "#000000",
}


def method_colour(comm: str) -> str:
    """The suite's colour of a method (its name, or a label that starts with it)."""
    name = str(comm).split()[0].split("/")[0].strip()
    return METHOD_COLOURS.get(name, "#000000")


def method_width(comm: str) -> float:
    """Line width: the paper's methods drawn thicker."""
    return 2.4 if str(comm).split()[0] in PAPER_METHODS else 1.4


def fig_width(panels: int, per_panel: float = 5.0, extra: float = 0.0) -> float:
    """Figure width in inches for ``panels`` panels in one row, capped at
    :data:`MAX_WIDTH_PX`."""
    return min(per_panel * panels + extra, MAX_WIDTH_PX / DPI)


def _accuracy_panel(
    ax, runs: Sequence[tuple[str, pd.DataFrame]], metric: str, target: float, x: str
) -> None:
    """Held-out ``metric`` (%) against column ``x``, one line per run, target dashed.

    Curves may carry the flat column names of older runs: they are renamed first.
    """
    column = metric_column(metric)
    for label, df in runs:
        d = df.rename(columns=RENAMES).dropna(subset=[column])
        ax.plot(d[x], 100 * d[column], marker="o", ms=3, label=label)
    ax.axhline(100 * target, color="k", ls="--", lw=1, label=f"target {100 * target:g} %")
    ax.set_xlabel(TIME_LABEL if x == TRAIN_TIME else x)
    ax.set_ylabel(f"held-out {metric} (%)")
    ax.grid(alpha=0.3)


def save_figure(fig, path: str | Path, layout: bool = True) -> Path:
    """Lay out (unless the caller did: ``layout=False``), write (:data:`DPI`, parents
    created) and close a figure.

    Every PNG of the suite goes through here.
    """
    if layout:
        fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_time_to_accuracy(
    curves: Sequence[tuple[str, pd.DataFrame]],
    *,
    metric: str,
    target: float,
    path: str | Path,
    title: str,
    hardware: str = "",
) -> Path:
    """Held-out ``metric`` against training time (s), one line per run."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _accuracy_panel(ax, curves, metric, target, TRAIN_TIME)
    ax.set_title(title + (f"\n{hardware}" if hardware else ""), fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_comparison(
    runs: Sequence[tuple[str, pd.DataFrame]],
    *,
    metric: str,
    target: float,
    path: str | Path,
    title: str,
    hardware: str = "",
) -> Path:
    """Two panels: held-out ``metric`` per epoch, and against training time."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    _accuracy_panel(axes[0], runs, metric, target, EPOCH)
    _accuracy_panel(axes[1], runs, metric, target, TRAIN_TIME)
    axes[0].legend(fontsize=8)
    fig.suptitle(title + (f"\n{hardware}" if hardware else ""), fontsize=9)
    return save_figure(fig, path)
