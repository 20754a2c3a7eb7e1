"""Figures drawn from result records and curves alone (no rerun needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def plot_time_to_accuracy(
    curves: Sequence[tuple[str, pd.DataFrame]],
    *,
    metric: str,
    target: float,
    path: str | Path,
    title: str,
    hardware: str = "",
) -> Path:
    """Held-out ``metric`` against training time (s), one line per run, target dashed."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, df in curves:
        d = df.dropna(subset=[metric])
        ax.plot(d["train_time_s"], 100 * d[metric], marker="o", ms=3, label=label)
    ax.axhline(100 * target, color="k", ls="--", lw=1, label=f"target {100 * target:g} %")
    ax.set_xlabel("training time (s, evaluation excluded)")
    ax.set_ylabel(f"held-out {metric} (%)")
    ax.set_title(title + (f"\n{hardware}" if hardware else ""), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
    for label, df in runs:
        d = df.dropna(subset=[metric])
        axes[0].plot(d["epoch"], 100 * d[metric], marker="o", ms=3, label=label)
        axes[1].plot(d["train_time_s"], 100 * d[metric], marker="o", ms=3, label=label)
    for ax, xl in zip(axes, ("epoch", "training time (s, evaluation excluded)")):
        ax.axhline(100 * target, color="k", ls="--", lw=1)
        ax.set_xlabel(xl)
        ax.set_ylabel(f"held-out {metric} (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title + (f"\n{hardware}" if hardware else ""), fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
