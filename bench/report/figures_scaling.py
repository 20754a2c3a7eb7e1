"""The scaling study's figure: efficiency against nodes per method, from its CSV alone.

Left: the sizes measured on this machine, one colour per method, solid with filled
markers; the model's prediction of each point (made before the run) beside it, dotted
with hollow markers; the marker's shape says the workers per node.  Right: the model's
projection to the paper's cluster (nodes of 8 V100, 25 Gbit/s), dashed with its band
over the assumptions -- drawn only when the sweep's ``model_holds`` says the model
predicted every measured step time within its tolerance; otherwise the panel says so.
Older scaling CSVs (``nnodes``, ``nproc_per_node``, no predictions) draw their measured
points and, having no check of the model, no projection.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from bench.results.plots import method_colour, save_figure  # noqa: E402

MARKERS = {1: "o", 2: "s", 4: "^", 8: "D"}  # workers per node
INVALID_ABOVE = 1.05  # efficiency above this: the compute-only reference is at fault
REFERENCE = "nocomm"  # the compute-only runs: efficiency 1 by definition, not drawn


def newest_sweep(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of the newest sweep (sweep ids sort by start time), preferring one with
    predictions; older column names renamed (``nnodes`` -> ``nodes`` ...)."""
    df = frame.copy()
    for old, new in (("nnodes", "nodes"), ("nproc_per_node", "workers_per_node")):
        if old in df.columns:  # an older CSV's name, alone or beside a newer CSV's rows
            df[new] = df[new].fillna(df[old]) if new in df.columns else df[old]
            df = df.drop(columns=old)
    if "workers_per_node" not in df.columns:
        df["workers_per_node"] = 1
    if "sweep_id" not in df.columns or df["sweep_id"].isna().all():
        return df
    new = df[df["predicted_step_s"].notna()] if "predicted_step_s" in df.columns else df[:0]
    ids = sorted((new if len(new) else df)["sweep_id"].dropna().astype(str).unique())
    return df[df["sweep_id"].astype(str) == ids[-1]]


def _measured(ax, meas: pd.DataFrame, colours: dict[str, str]) -> None:
    for (comm, per), g in meas.groupby(["comm", "workers_per_node"], sort=True):
        g = g.sort_values("nodes")
        mk = MARKERS.get(int(per), "o")
        ax.plot(g["nodes"], g["efficiency"], "-", marker=mk, color=colours[comm])
        if "predicted_efficiency" in g.columns and g["predicted_efficiency"].notna().any():
            ax.plot(g["nodes"], g["predicted_efficiency"], ":", marker=mk, mfc="none",
                    color=colours[comm], alpha=0.8)  # fmt: skip


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


def plot_scaling(frame: pd.DataFrame, path: Path) -> Path | None:
    """Efficiency against nodes of the newest sweep in ``frame`` (its CSV's rows)."""
    need = {"efficiency", "comm"}
    if frame.empty or not need <= set(frame.columns):
        return None
    df = newest_sweep(frame)
    kind = df["kind"] if "kind" in df.columns else pd.Series("measured", index=df.index)
    meas = df[(kind == "measured") & (df["comm"] != REFERENCE)].dropna(subset=["efficiency"])
    proj = df[kind == "projected"]
    if meas.empty and proj.empty:
        return None
    comms = list(dict.fromkeys([*meas["comm"], *proj["comm"]]))
    colours = {c: method_colour(c) for c in comms}  # the suite's one palette
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    _measured(left, meas, colours)
    over = meas[meas["efficiency"] > INVALID_ABOVE]
    if len(over):  # a compute-only run slower than a communicating one: a fault, say it
        sizes = ", ".join(
            sorted(
                {
                    f"{int(n)}x{int(m)}"
                    for n, m in zip(over["nodes"], over["workers_per_node"], strict=True)
                }
            )
        )
        left.text(0.02, 0.03, f"{len(over)} point(s) above {INVALID_ABOVE:g} (sizes {sizes}) lie "
                  "off the axis:\ntheir compute-only runs were slower than runs that "
                  "communicate --\na measurement fault, not an efficiency",
                  transform=left.transAxes, fontsize=7, color="firebrick")  # fmt: skip
    cluster = ", ".join(sorted(meas["cluster"].dropna().astype(str).unique())) or "?"
    left.set_xlabel(f"nodes measured on this machine ({cluster}; log 2)")
    left.set_ylabel("scaling efficiency (compute-only step / step, ratio)")
    drawn = _holds(proj)
    if drawn:
        _projected(right, proj, colours)
    else:
        why = "no projection in this table" if proj.empty else _worst(meas)
        right.text(0.5, 0.5, f"projection not drawn:\n{why}", ha="center", va="center",
                   transform=right.transAxes, fontsize=9)  # fmt: skip
    right.set_xlabel("nodes of 8 V100 at 25 Gbit/s (model; log 2)")
    for ax, rows in ((left, meas), (right, proj if drawn else proj[:0])):
        ax.set_xscale("log", base=2)
        ticks = sorted({int(n) for n in rows["nodes"].dropna()})
        if ticks:  # the node counts themselves, not powers of 2
            ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_ylim(0, 1.1)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colours[c], lw=2, label=c) for c in comms]
    handles += [
        Line2D([], [], color="k", ls="-", marker="o", label="measured"),
        Line2D(
            [],
            [],
            color="k",
            ls=":",
            marker="o",
            mfc="none",
            label="model (compute: the size's calibration run)",
        ),
    ]
    if drawn:
        handles.append(Line2D([], [], color="k", ls="--", label="projected (band: assumptions)"))
    pers = sorted({int(p) for p in meas["workers_per_node"].dropna()}) if len(meas) else []
    if len(pers) > 1:
        handles += [Line2D([], [], color="grey", ls="", marker=MARKERS.get(p, "o"),
                           label=f"{p} worker(s)/node") for p in pers]  # fmt: skip
    # one legend, outside the right panel (tight_layout makes room for an axes' legend)
    right.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    sweep = str(df["sweep_id"].iloc[0]) if "sweep_id" in df.columns and len(df) else ""
    fig.suptitle(f"Scaling efficiency against nodes per method, {sweep}", fontsize=11)
    return save_figure(fig, path)
