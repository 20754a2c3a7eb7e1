"""Figures drawn from result records and curves alone (no rerun needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

TIME_LABEL = "training time (s, evaluation excluded)"


def _accuracy_panel(ax, runs: Sequence[tuple[str, pd.DataFrame]], metric: str, target: float, x: str) -> None:
    """Held-out ``metric`` (%) against column ``x``, one line per run, target dashed."""
    for label, df in runs:
        d = df.dropna(subset=[metric])
        ax.plot(d[x], 100 * d[metric], marker="o", ms=3, label=label)
    ax.axhline(100 * target, color="k", ls="--", lw=1, label=f"target {100 * target:g} %")
    ax.set_xlabel(TIME_LABEL if x == "train_time_s" else x)
    ax.set_ylabel(f"held-out {metric} (%)")
    ax.grid(alpha=0.3)


def save_figure(fig, path: str | Path) -> Path:
    """Lay out, write (120 dpi, parents created) and close a figure; every PNG of the suite goes through here."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
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
    _accuracy_panel(ax, curves, metric, target, "train_time_s")
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
    _accuracy_panel(axes[0], runs, metric, target, "epoch")
    _accuracy_panel(axes[1], runs, metric, target, "train_time_s")
    axes[0].legend(fontsize=8)
    fig.suptitle(title + (f"\n{hardware}" if hardware else ""), fontsize=9)
    return save_figure(fig, path)
