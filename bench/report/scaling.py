"""The scaling study in the report: which sweep its figure draws (:func:`newest_sweep`),
the figure, and the lines that say what it shows and how well the model held."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from bench import methods  # noqa: E402
from bench.report.tables import read  # noqa: E402
from bench.results.columns import newer_scaling  # noqa: E402
from bench.results.plots import fig_width, save_figure  # noqa: E402
from bench.sweeps import scaling_table  # noqa: E402


def _methods(df: pd.DataFrame) -> pd.Series:
    """The rows of methods, not of the compute-only reference (efficiency 1 by definition)."""
    return ~df["comm"].isin(methods.names(group="reference"))


def newest_sweep(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the sweep to draw: the broadest (:func:`_sweeps_by_breadth`), so that a
    narrower check run later (:func:`later_checks`) does not hide the study it checks."""
    df = newer_scaling(frame)
    ids = _sweeps_by_breadth(df)
    return df if not ids else df[df["sweep_id"].astype(str) == ids[-1]]


def later_checks(frame: pd.DataFrame) -> list[pd.DataFrame]:
    """The rows of each sweep with predictions newer than :func:`newest_sweep`'s."""
    df = newer_scaling(frame)
    ids = _sweeps_by_breadth(df)
    if not ids or "predicted_step_s" not in df.columns:
        return []
    main = ids[-1]
    new = df[df["predicted_step_s"].notna()]
    later = sorted(x for x in new["sweep_id"].dropna().astype(str).unique() if x > main)
    return [df[df["sweep_id"].astype(str) == x] for x in later]


def _sweeps_by_breadth(df: pd.DataFrame) -> list[str]:
    """Sweep ids (with predictions where any has them) by (methods measured, sizes, id)."""
    if "sweep_id" not in df.columns or df["sweep_id"].isna().all():
        return []
    new = df[df["predicted_step_s"].notna()] if "predicted_step_s" in df.columns else df[:0]
    pool = new if len(new) else df
    pool = pool[pool["sweep_id"].notna()].astype({"sweep_id": str})

    def breadth(sweep: str) -> tuple[int, int, str]:
        g = pool[(pool["sweep_id"] == sweep) & _methods(pool)]
        if "kind" in g.columns:
            g = g[g["kind"].fillna("measured") == "measured"]
        sizes = {tuple(x) for x in g[["nodes", "workers_per_node"]].itertuples(index=False)}
        return g["comm"].nunique(), len(sizes), sweep

    return sorted(pool["sweep_id"].unique(), key=breadth)


def _measured(ax, meas: pd.DataFrame, comms: list[str]) -> None:
    """A line per method (set a little apart along x), each point with its 95 % interval, a
    fault ringed in black; the model's prediction as hollow markers without a line."""
    flag = scaling_table.above_one_of(meas)
    nan = pd.Series(float("nan"), index=meas.index)
    for i, comm in enumerate(comms):
        g = meas[meas["comm"] == comm].sort_values("nodes")
        if g.empty:
            continue
        c, x = methods.colour(comm), g["nodes"] * 2 ** (0.025 * (i - (len(comms) - 1) / 2))
        lo, hi = (meas.get(f"efficiency_ci_{b}", nan)[g.index] for b in ("low", "high"))
        err = [(g["efficiency"] - lo).clip(lower=0).fillna(0),
               (hi - g["efficiency"]).clip(lower=0).fillna(0)]  # fmt: skip
        ax.errorbar(x, g["efficiency"], yerr=err, fmt="-o", color=c, ms=4, capsize=2,
                    lw=methods.width(comm), elinewidth=1)  # fmt: skip
        bad = flag[g.index] == scaling_table.FAULT
        ax.plot(x[bad], g["efficiency"][bad], ls="", marker="o", ms=11, mfc="none",
                mec="k", mew=1.5)  # fmt: skip
        if "predicted_efficiency" in g.columns and g["predicted_efficiency"].notna().any():
            ax.plot(x, g["predicted_efficiency"], ls="", marker="o", mfc="none",
                    ms=8, color=c, alpha=0.8)  # fmt: skip


def _projected(ax, proj: pd.DataFrame) -> None:
    for comm, g in proj.groupby("comm", sort=True):
        g = g.sort_values("nodes")
        ax.plot(g["nodes"], g["efficiency"], "--", marker=".", color=methods.colour(comm))
        if {"efficiency_min", "efficiency_max"} <= set(g.columns):
            if g["efficiency_min"].notna().all():
                ax.fill_between(g["nodes"], g["efficiency_min"], g["efficiency_max"],
                                color=methods.colour(comm), alpha=0.12)  # fmt: skip


def _log2_nodes(ax, nodes: pd.Series, pad: float = 0.0) -> None:
    """A log-2 axis of nodes, ticked at the node counts themselves (not powers of 2), ``pad``
    (in powers of 2) of room either side."""
    ticks = sorted({int(n) for n in nodes.dropna()})
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks, [str(t) for t in ticks])
    if ticks and pad:
        ax.set_xlim(ticks[0] / 2**pad, ticks[-1] * 2**pad)


def plot_scaling(frame: pd.DataFrame, path: Path) -> Path | None:
    """Efficiency against nodes of :func:`newest_sweep`, a panel per workers per node, and
    the model's projection to the paper's cluster on its own axis."""
    need = {"efficiency", "comm"}
    if frame.empty or not need <= set(frame.columns):
        return None
    df = newest_sweep(frame)
    kind = df["kind"] if "kind" in df.columns else pd.Series("measured", index=df.index)
    every = df[kind == "measured"].dropna(subset=["efficiency"])  # the reference's rows too
    if "workers_per_node" not in every.columns:
        every = every.assign(workers_per_node=1)
    meas = every[_methods(every)]
    proj = df[kind == "projected"]
    if meas.empty and proj.empty:
        return None
    # every method in the registry's order (a name no spec knows last), in every panel
    comms = sorted(
        dict.fromkeys([*meas["comm"], *proj["comm"]]),
        key=lambda c: (methods.get(c).order if c in methods.METHODS else 1e9, c),
    )
    # up to 1.5: a longer bar (a few noisy runs) runs off the panel, not squash the points
    highs = meas.get("efficiency_ci_high", meas["efficiency"]).clip(upper=1.45)
    top = max(1.1, float(pd.concat([meas["efficiency"], highs]).max()) + 0.05)
    pers = sorted({int(p) for p in meas["workers_per_node"].dropna()}) or [1]
    fig, axes = plt.subplots(
        1, len(pers) + 1, figsize=(fig_width(len(pers) + 1, 5.2), 6.4), squeeze=False
    )
    axes = list(axes[0])
    cluster = ", ".join(sorted(meas["cluster"].dropna().astype(str).unique())) or "?"
    n = int(meas["n_runs"].max()) if "n_runs" in meas and meas["n_runs"].notna().any() else 1
    for ax, per in zip(axes, pers, strict=False):
        _measured(ax, meas[meas["workers_per_node"] == per], comms)
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        ax.set_title(f"measured on this machine: {per} worker(s) per node", fontsize=9)
        ax.set_xlabel(f"nodes ({cluster}; log 2)")
        ax.set_ylim(0, top)
        _log2_nodes(ax, meas["nodes"], pad=0.3)  # room for the methods set apart
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("scaling efficiency (compute-only step / step, ratio)")
    right = axes[-1]
    holds = proj["model_holds"].dropna() if "model_holds" in proj.columns else pd.Series()
    drawn = bool(len(holds)) and holds.astype(str).str.lower().isin(["true", "1", "1.0"]).all()
    if drawn:
        _projected(right, proj)
        _log2_nodes(right, proj["nodes"])
    else:
        why = "no projection in this table"
        if not proj.empty and ("model_error" not in meas or meas["model_error"].dropna().empty):
            why = "this sweep has no prediction to check the model against"
        elif not proj.empty:
            r = meas.loc[meas["model_error"].abs().idxmax()]
            why = (
                f"the model missed {r['comm']} on {int(r['nodes'])}x{int(r['workers_per_node'])} "
                f"by {r['model_error']:+.0%}"
            )
        right.text(0.5, 0.5, f"projection not drawn:\n{why}", ha="center", va="center",
                   transform=right.transAxes, fontsize=9, wrap=True)  # fmt: skip
        right.set_xticks([])
    right.set_ylim(0, top)
    right.grid(alpha=0.3)
    right.set_title("projected: the model, not a measurement", fontsize=9)
    right.set_xlabel("nodes of 8 V100 at 25 Gbit/s (model; log 2)")
    right.set_ylabel("projected scaling efficiency (ratio)")
    handles = [Line2D([], [], color=methods.colour(c), lw=methods.width(c), label=c) for c in comms]
    handles += [
        Line2D([], [], color="k", ls="-", marker="o", ms=4,
               label=f"measured: geometric mean of n = {n} run(s),\nbar: its 95 % interval"),
        Line2D([], [], color="k", ls="", marker="o", mfc="none", ms=8,
               label="model's prediction for that size"),
        Line2D([], [], ls="", marker="o", ms=11, mfc="none", mec="k", mew=1.5,
               label="above 1 beyond its interval:\na measurement fault, not a gain"),
    ]  # fmt: skip
    if drawn:
        handles.append(Line2D([], [], color="k", ls="--", label="projected (band: assumptions)"))
    # a legend below the last panel, the points above 1 below the first: tight_layout fits both
    right.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2,
                 fontsize=8, frameon=False)  # fmt: skip
    note = scaling_table.above_one_lines(every)
    if note:  # a point above 1 says how it reads, under the first panel (as the table does)
        text = "\n".join(textwrap.wrap("Above 1: " + "; ".join(note) + ".", 75))
        axes[0].text(0.0, -0.13, text, transform=axes[0].transAxes, fontsize=7.5, va="top")
    sweep = str(df["sweep_id"].iloc[0]) if "sweep_id" in df.columns and len(df) else ""
    rounds = f"the geometric mean of {n} runs with its 95 % interval" if n > 1 else (
        "one run (n = 1, no interval)")  # fmt: skip
    fig.suptitle(
        f"Scaling efficiency against nodes per method, sweep {sweep}\neach measured point is "
        f"{rounds}; the projection has its own axis",
        fontsize=10,
    )
    return save_figure(fig, path)


def read_scaling(paths: Sequence[Path]) -> pd.DataFrame:
    """The rows of every readable scaling CSV of ``paths``, with its file's name (``_csv``)."""
    frames = [df.assign(_csv=f.name) for f in paths if (df := read(f)) is not None]
    return pd.concat(frames, ignore_index=True, sort=False) if frames else pd.DataFrame()


def scaling_caption(paths: Sequence[Path]) -> str:
    """The scaling figure's caption: the one sweep it draws and its CSV, not every CSV read."""
    frame = read_scaling(paths)
    df = newest_sweep(frame) if len(frame) else frame
    if df.empty or "sweep_id" not in df.columns or df["sweep_id"].isna().all():
        return f"scaling efficiency against nodes, from {', '.join(f.name for f in paths)}"
    csv = ", ".join(dict.fromkeys(df["_csv"]))
    rest = len(paths) - len(set(df["_csv"]))
    older = f"; {rest} other scaling CSV(s) in the appendix" if rest > 0 else ""
    return (
        f"scaling efficiency against nodes, sweep {df['sweep_id'].iloc[0]} ({csv}: of the "
        f"sweeps with the model's predictions, the one that measured the most methods and "
        f"sizes){older}"
    )


def scaling_lines(paths: Sequence[Path]) -> list[str]:
    """What the drawn scaling sweep shows, then each later check (:func:`later_check_lines`)."""
    frame = read_scaling(paths)
    if frame.empty:
        return []
    df = newest_sweep(frame)
    if "predicted_step_s" not in df or df["predicted_step_s"].isna().all():
        return []
    what = "efficiency = the compute-only step / the method's step at the same size, measured "
    head = f"Scaling, sweep `{{}}` ({what}on this machine)"
    return [*_paragraph(df, head), *later_check_lines(frame)]


def _paragraph(df: pd.DataFrame, head: str) -> list[str]:
    """``head`` (its ``{}``: the sweep id), each method's efficiency per size and whether the
    model held."""
    df = df.astype({"nodes": int, "workers_per_node": int})  # 4x1, not 4.0x1.0
    held = "; ".join(x.strip() for x in scaling_table.summary(df))
    return [f"{head.format(df['sweep_id'].iloc[0])}: {'; '.join(_efficiencies(df))}.  {held}.", ""]


def _efficiencies(df: pd.DataFrame) -> list[str]:
    """``dense 0.52 [0.48, 0.55] at 2x2, 0.38 [0.36, 0.41] at 4x2`` per method measured on
    more than one node."""
    meas = df[(df["kind"] == "measured") & _methods(df) & (df["nodes"] > 1)]
    per = []
    for comm, g in meas.groupby("comm", sort=False):
        g = g.sort_values("nodes")
        cells = ", ".join(scaling_table.point_text(r) for _, r in g.iterrows())
        per.append(f"{comm} {cells}")
    return per


def later_check_lines(frame: pd.DataFrame) -> list[str]:
    """A paragraph per narrower sweep run after the drawn study."""
    head = "Model check, sweep `{}` (not drawn; efficiency as above)"
    return [x for df in later_checks(frame) if _efficiencies(df) for x in _paragraph(df, head)]
