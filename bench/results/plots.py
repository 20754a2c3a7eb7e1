"""The palette of what is not a method (a method's colour is its spec's), the figure writer,
and a run's own time-to-accuracy figure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from bench.results.columns import EPOCH, TRAIN_TIME, metric_column  # noqa: E402

TIME_LABEL = "training time (s, evaluation excluded)"
MAX_WIDTH_PX = 2400  # no figure of the suite is wider (at DPI); tests check it
DPI = 120

# every colour here keeps MIN_DISTANCE from a method's (tests/test_palette.py): teals and a
# neutral family.  The per-step phases of a breakdown, in stacking order:
PHASE_COLOURS = {
    "data wait": "#e6dcc3",
    "forward+backward": "#b2dfdb",
    "selection": "#9c8f6e",
    "communication": "#00695c",
    "optimizer update": "#2e2a24",
}
# baselines that are not methods (torch.topk, torch's optimizers, the per-tensor loop, a floor)
BASELINE_COLOURS = {
    "floor": "#000000",
    "torch.topk": "#000000",
    "fused": "#2e2a24",
    "foreach": "#9c8f6e",
    "naive": "#e6dcc3",
}
# optimizer update modes: torch's as baselines, this project's flat update its own
UPDATE_COLOURS = {
    "naive": BASELINE_COLOURS["naive"],
    "foreach": BASELINE_COLOURS["foreach"],
    "fused": BASELINE_COLOURS["fused"],
    "flat": "#3a9d8f",
    "other": "#7fc4b8",
}
SELECTOR = "#ff7f0e"  # the paper's selection's colour (its spec's): all its implementations
SELECTION_COLOURS = {
    "sum": BASELINE_COLOURS["floor"],
    "torch.topk": BASELINE_COLOURS["torch.topk"],
    **dict.fromkeys(("tiled", "paper", "sampled", "hist", "other"), SELECTOR),
}
SELECTION_STYLES = {
    "sum": ("--", ""),
    "torch.topk": ("-", "x"),
    "tiled": ("-", "o"),
    "paper": ("-", "s"),
    "sampled": ("-.", "^"),
    "hist": (":", "D"),
    "other": (":", "v"),
}
CACHE_COLOURS = {
    "none": BASELINE_COLOURS["foreach"],
    "disk": "#b2dfdb",
    "memory": "#4db6ac",
    "multilevel": "#00897b",
    "predecoded": "#004d40",
    "other": "#80cbc4",
}
# quantities side by side (measured against the model, totals, throughput)
BENCH_COLOURS = {
    "measured": BASELINE_COLOURS["fused"],
    "model": BASELINE_COLOURS["naive"],
    "total": BASELINE_COLOURS["foreach"],
    "inter-node": BASELINE_COLOURS["naive"],
    "alone": BASELINE_COLOURS["foreach"],
    "exposed": BASELINE_COLOURS["fused"],
    "images": "#3a9d8f",
    "tokens": "#80cbc4",
    "reference": BASELINE_COLOURS["floor"],
}
MIN_DISTANCE = 40  # RGB distance, 0-255 a channel


def rgb(colour: str) -> tuple[int, int, int]:
    c = colour.lstrip("#")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)


def colour_distance(a: str, b: str) -> float:
    return sum((x - y) ** 2 for x, y in zip(rgb(a), rgb(b), strict=True)) ** 0.5


def fig_width(panels: int, per_panel: float) -> float:
    return min(per_panel * panels, MAX_WIDTH_PX / DPI)


def save_figure(fig, path: str | Path, layout: bool = True) -> Path:
    """Every PNG of the suite: laid out (unless the caller did), written at :data:`DPI`."""
    if layout:
        fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


RUN_STYLES = ("-", "--", ":", "-.")  # runs of one method in one figure, in order
RUN_MARKERS = ("o", "s", "^", "D")  # runs of one figure, in order


def plot_time_to_accuracy(
    curves: Sequence[tuple[str, pd.DataFrame]],
    *,
    metric: str,
    target: float,
    path: str | Path,
    title: str,
    hardware: str = "",
    per_epoch: bool = False,
    colours: Sequence[str] | None = None,
) -> Path:
    """Held-out ``metric`` against training time (``per_epoch``: and epochs); the first run
    wide and translucent, later ones thin over it, so that runs with one curve stay visible."""
    xs = (EPOCH, TRAIN_TIME) if per_epoch else (TRAIN_TIME,)
    fig = plt.subplots(1, len(xs), figsize=(11, 4.2) if per_epoch else (7, 4.5))[0]
    column = metric_column(metric)
    styles = []
    seen: dict[str, int] = {}
    for i, c in enumerate(colours or [None] * len(curves)):
        k = seen[str(c)] = seen.get(str(c), -1) + 1
        style = {"ls": RUN_STYLES[k % len(RUN_STYLES)], "marker": RUN_MARKERS[i % 4]}
        if i:
            style |= {"lw": 1.5, "ms": 5, "mfc": "white", "zorder": 2 + i}
        else:
            style |= {"lw": 5, "ms": 9, "alpha": 0.4} if len(curves) > 1 else {"ms": 3}
        styles.append(style | ({"color": c} if c is not None else {}))
    for ax, x in zip(fig.axes, xs, strict=True):
        for i, (label, df) in enumerate(curves):
            d = df.dropna(subset=[column])
            ax.plot(d[x], 100 * d[column], label=label, **styles[i])
        ax.axhline(100 * target, color="k", ls="--", lw=1, label=f"target {100 * target:g} %")
        ax.set_xlabel(TIME_LABEL if x == TRAIN_TIME else x)
        ax.set_ylabel(f"held-out {metric} (%)")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=8)
    head = title + (f"\n{hardware}" if hardware else "")
    if per_epoch:
        fig.suptitle(head, fontsize=9)
    else:
        fig.axes[0].set_title(head, fontsize=9)
    return save_figure(fig, path)
