"""The figures of a tuning-protocol sweep (:mod:`bench.sweeps.protocol`): the answer.

- ``speedup_<experiment>.png``: each method's selected configuration against dense and
  against the best peer, the speedup in time to target with its 95 % interval over the
  evaluation seeds and its verdict, from the sweep's table (``<sweep_id>.csv``);
- ``ratios_<experiment>.png``: the same runs' steps to target composed with the
  performance model's time per step across communication / compute ratios
  (:mod:`bench.sweeps.ratios`), where each method stops winning.

Both are drawn from the sweep's table and records alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from bench.results.plots import (  # noqa: E402
    PAPER_METHODS,
    fig_width,
    method_colour,
    save_figure,
)

VERDICT_SHORT = {"faster": "faster", "slower": "slower"}  # else: no difference measurable


def sweep_id_of(table: Path) -> str:
    return table.stem


def plan_of(table: Path) -> dict[str, Any]:
    """The sweep's plan (``<sweep_id>.plan.json`` beside its table)."""
    return json.loads(table.with_name(f"{table.stem}.plan.json").read_text())


def _b(x: float) -> str:
    """An interval bound: 3 digits where 2 would print a bound off 1 as 1.00."""
    return f"{x:.3f}" if round(x, 2) == 1.0 and x != 1.0 else f"{x:.2f}"


def _verdict(v: object, n: int) -> str:
    text = str(v)
    return VERDICT_SHORT.get(text, f"no difference (n = {n})")


def plot_protocol_speedup(df: pd.DataFrame, path: Path, title: str) -> Path | None:
    """Two panels: speedup over dense and over the best peer, one row per method (its
    selected trial), point = ratio of mean times, bar = 95 % interval, the verdict and
    runs reached written beside it."""
    if df.empty or "speedup_vs_dense" not in df:
        return None
    df = df.sort_values("time_to_target_mean_s").reset_index(drop=True)
    peer = str(df["best_peer"].dropna().iloc[0]) if df["best_peer"].notna().any() else "peer"
    fig, axes = plt.subplots(1, 2, figsize=(fig_width(2, 6.2), 1.6 + 0.42 * len(df)), sharey=True)
    for ax, (key, label) in zip(
        axes, (("speedup_vs_dense", "dense DDP"), ("speedup_vs_peer", f"the best peer, {peer}"))
    ):
        for i, r in df.iterrows():
            m, lo, hi = r[key], r[f"{key}_ci_low"], r[f"{key}_ci_high"]
            if m != m:
                continue
            colour = method_colour(r["comm"])
            paper = r["comm"] in PAPER_METHODS
            err = [[max(0.0, m - lo)], [max(0.0, hi - m)]] if lo == lo else None
            ax.errorbar(
                [m],
                [i],
                xerr=err,
                fmt="o",
                color=colour,
                ms=8 if paper else 6,
                capsize=4,
                lw=2.2 if paper else 1.4,
            )
            verdict = _verdict(r[key.replace("speedup", "verdict")], int(r["n_runs"]))
            itself = r["comm"] == ("dense" if key == "speedup_vs_dense" else peer)
            ax.annotate(
                "the baseline" if itself else f"{m:.2f}x [{_b(lo)}, {_b(hi)}], {verdict}",
                (hi if hi == hi else m, i),
                xytext=(6, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
            )
        ax.axvline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xlabel(f"speedup over {label} (x; > 1: sooner to target)")
        ax.grid(alpha=0.3, axis="x")
        lo_all = pd.concat([df[f"{key}_ci_low"], df[key]]).min()
        hi_all = pd.concat([df[f"{key}_ci_high"], df[key]]).max()
        if lo_all == lo_all and hi_all == hi_all:
            left = min(0.8, lo_all - 0.1)  # room on the right for the written interval
            ax.set_xlim(left, max(1.25, hi_all + 0.75 * (hi_all - left)))
    labels = [
        f"{r['comm']} {r['trial']} ({r['n_reached']}/{r['n_runs']} reached)"
        for _, r in df.iterrows()
    ]
    axes[0].set_yticks(range(len(df)), labels, fontsize=8)
    axes[0].invert_yaxis()
    for t, c in zip(axes[0].get_yticklabels(), df["comm"], strict=True):
        t.set_color(method_colour(c))
        if c in PAPER_METHODS:
            t.set_fontweight("bold")
    fig.suptitle(
        f"{title}\npoint: ratio of mean times to target; bar: 95 % bootstrap interval over "
        "evaluation seeds",
        fontsize=9,
    )
    return save_figure(fig, path)


def ratio_runs(results_dir: Path, table: pd.DataFrame) -> list:
    """The sweep's evaluation runs as :class:`bench.sweeps.ratios.Run` (grouped by method),
    the runs the composition uses; ``[]`` when none has step counts."""
    from bench.sweeps import ratios

    sweep = str(table["sweep_id"].iloc[0])
    ids = {i for v in table["run_ids"].dropna() for i in str(v).replace(",", " ").split()}

    def select(r: Mapping[str, Any]) -> bool:
        res = (r.get("config") or {}).get("results") or {}
        return res.get("sweep_id") == sweep and (not ids or r.get("run_id") in ids)

    runs, _ = ratios.load_runs(results_dir, select, group=lambda r: str(r["comm"]))
    return runs


def ratios_table(results_dir: Path, table: pd.DataFrame, n_boot: int = 2000) -> pd.DataFrame:
    """The composition (:func:`bench.sweeps.ratios.compose`) of the sweep's evaluation
    runs on the ratio grid and at the named settings; empty when it cannot be made."""
    from bench.sweeps import ratios

    runs = ratio_runs(results_dir, table)
    if not runs or "dense" not in {r.group for r in runs}:
        return pd.DataFrame()
    named = ratios.named_ratios()
    grid = sorted(set(ratios.GRID) | set(named.values()))
    return ratios.compose(runs, grid, n_boot=n_boot)


def plot_protocol_ratios(df: pd.DataFrame, path: Path, title: str) -> Path | None:
    from bench.sweeps import ratios

    if df.empty:
        return None
    return ratios.plot(df, path, title)
