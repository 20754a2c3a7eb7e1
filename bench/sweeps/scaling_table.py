"""The scaling study's table: each run's measured step time beside the model's prediction
(the sweep's plan), efficiency against the compute-only run of the same size, the
textbook efficiency beside it, and the projection to the paper's cluster.  One row per
(size, method), ``kind`` ``measured`` or ``projected``; every column: docs/internals/report.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from bench.cluster.netns import parse_bandwidth
from bench.methods import method_of
from bench.results.columns import EPOCH_TIME, SAMPLES, STEPS
from bench.results.records import read_curve
from bench.sweeps import scaling_model as sm

COLUMNS = [
    "sweep_id", "kind", "cluster", "nodes", "workers_per_node", "world_size", "comm",
    "density", "step_s", "compute_only_step_s", "efficiency", "textbook_efficiency",
    "throughput", "predicted_step_s", "predicted_efficiency", "model_error",
    "compute_only_spread", "calibration_step_s", "compute_drift", "predicted_before_launch_s",
    "model_error_before_launch", "efficiency_min", "efficiency_max", "model_holds",
    "inter_node_bandwidth", "target_ratio", "link_ratio", "measured_steps", "run_id", "note",
]  # fmt: skip
# the columns of the table the report shows (bench.report.answer)
REPORT_COLUMNS = [
    "kind", "nodes", "workers_per_node", "comm", "step_s", "compute_only_step_s",
    "efficiency", "textbook_efficiency", "throughput", "predicted_step_s", "model_error",
    "inter_node_bandwidth", "link_ratio",
    # an older table's names (before the compute-only reference)
    "nnodes", "nproc_per_node", "throughput_samples_per_s", "run_id",
]  # fmt: skip


def run_timing(rec: dict[str, Any]) -> tuple[float, float, int]:
    """(s per step, samples per s, steps) over a run's epochs after the first, from its
    curve (a single epoch: that one); NaNs when the curve is missing."""
    curve = rec.get("curve")
    if not curve or not Path(curve).is_file():
        return math.nan, math.nan, 0
    df = read_curve(curve)
    if df.empty or not {EPOCH_TIME, STEPS, SAMPLES} <= set(df.columns):
        return math.nan, math.nan, 0
    later = df.iloc[1:] if len(df) > 1 else df
    secs, steps = float(later[EPOCH_TIME].sum()), int(later[STEPS].sum())
    if secs <= 0 or steps < 1:
        return math.nan, math.nan, 0
    return secs / steps, float(later[SAMPLES].sum()) / secs, steps


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of a size's compute-only runs (first and last of the size): time per step
    over all their steps, mean throughput, and their spread (max - min) / mean."""
    steps = sum(r["measured_steps"] for r in runs)
    secs = sum(r["step_s"] * r["measured_steps"] for r in runs)
    each = [r["step_s"] for r in runs]
    mean = sum(each) / len(each)
    return {
        **runs[-1],
        "step_s": secs / steps if steps else math.nan,
        "throughput": sum(r["throughput"] for r in runs) / len(runs),
        "measured_steps": steps,
        "compute_only_spread": (max(each) - min(each)) / mean
        if mean > 0 and len(each) > 1
        else math.nan,
        "run_id": " ".join(str(r["run_id"]) for r in runs),
    }


def measured_rows(
    records: Sequence[dict[str, Any]], calibration_runs: int = 0,
    warmup_nocomm: int = sm.OLD_WARMUP_NOCOMM,
) -> list[dict[str, Any]]:  # fmt: skip
    """A row per (size, method) that finished (an error run has no step time: left out,
    counted by the caller); the latest attempt of a method wins, a size's compute-only
    runs after the warm-ups and ``calibration_runs`` are merged (:func:`_merge`); the
    calibration runs' step time is the row's ``calibration_step_s``."""
    rows: dict[tuple[int, int, str], dict[str, Any]] = {}
    nocomm: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in records:
        if r.get("status") not in ("ok", "target_missed"):
            continue
        cl = (r.get("config") or {}).get("cluster") or {}
        n, m = int(cl.get("nnodes", 1)), int(cl.get("nproc_per_node", 1))
        step, thr, steps = run_timing(r)
        prof = r.get("cluster_profile") or {}
        row = {
            "kind": "measured",
            "cluster": cl.get("name", ""),
            "nodes": n,
            "workers_per_node": m,
            "world_size": n * m,
            "comm": method_of(r),  # DeMo (comm=nocomm) and the sync strategies by name
            "step_s": step,
            "throughput": thr,
            "measured_steps": steps,
            "inter_node_bandwidth": cl.get("inter_node_bandwidth") if n > 1 else "",
            "target_ratio": prof.get("target_ratio", math.nan),
            "run_id": r.get("run_id"),
        }
        if row["comm"] == sm.NOCOMM and steps:
            nocomm.setdefault((n, m), []).append(row)
        else:
            rows[(n, m, str(row["comm"]))] = row
    for (n, m), runs in nocomm.items():
        # the first warmup_nocomm warmed the launch up (a plan whose warm-ups were
        # compute-only runs; bench.sweeps.scaling.points), the next calibration_runs
        # calibrated the model; a size with fewer runs (an older plan: one before the
        # methods, one after) keeps all
        first = warmup_nocomm + calibration_runs
        kept = runs[first:] if len(runs) > first else runs
        cal = runs[warmup_nocomm:first] if len(runs) > first else []
        row = _merge(kept)
        row["calibration_step_s"] = _merge(cal)["step_s"] if cal else math.nan
        # how far the compute-only step moved while the methods ran
        row["compute_drift"] = row["step_s"] / row["calibration_step_s"] - 1 if cal else math.nan
        rows[(n, m, sm.NOCOMM)] = row
    return list(rows.values())


def efficiency(df: pd.DataFrame) -> pd.DataFrame:
    """``compute_only_step_s``, ``efficiency`` and ``textbook_efficiency`` of measured
    rows (columns nodes, workers_per_node, world_size, comm, step_s, throughput)."""
    df = df.copy()
    ref = df[df["comm"] == sm.NOCOMM].set_index(["nodes", "workers_per_node"])["step_s"]
    keys = list(zip(df["nodes"], df["workers_per_node"]))
    df["compute_only_step_s"] = [float(ref.get(k, math.nan)) for k in keys]
    df["efficiency"] = df["compute_only_step_s"] / df["step_s"]
    one = df[(df["world_size"] == 1) & (df["comm"] == sm.NOCOMM)]["throughput"]
    base = float(one.iloc[0]) if len(one) else math.nan
    df["textbook_efficiency"] = df["throughput"] / (df["world_size"] * base)
    return df


def with_predictions(df: pd.DataFrame, plan: dict[str, Any]) -> pd.DataFrame:
    """The plan's predictions beside the measured rows, the model's error and link ratio."""
    pred = {(p["nodes"], p["workers_per_node"], p["comm"]): p for p in plan.get("predictions", [])}
    sizes = {(s["nodes"], s["workers_per_node"]): s for s in plan.get("sizes", [])}
    df = df.copy()
    keys = list(zip(df["nodes"], df["workers_per_node"], df["comm"]))
    get = [pred.get(k, {}) for k in keys]
    df["density"] = [p.get("density", math.nan) for p in get]
    before = [p.get("predicted_step_s", math.nan) for p in get]
    planned = [p.get("predicted_compute_only_step_s", math.nan) for p in get]
    df["predicted_before_launch_s"] = before
    # the model's compute input at each size: the size's calibration run, measured in
    # its launch before any method ran (a plan without one: the timing before the launch);
    # the model's step is compute + exposed aggregation + update, so a new compute shifts it
    cal = calibration(df)
    cal_of = [cal.get((n, m), math.nan) for n, m, _ in keys]
    compute = [c if c == c else p for c, p in zip(cal_of, planned)]
    df["predicted_step_s"] = [b - p + c if c == c and p == p else b
                              for b, p, c in zip(before, planned, cal_of)]  # fmt: skip
    df["predicted_efficiency"] = [c / s if s else math.nan
                                  for c, s in zip(compute, df["predicted_step_s"])]  # fmt: skip
    df["model_error"] = df["predicted_step_s"] / df["step_s"] - 1
    df["model_error_before_launch"] = df["predicted_before_launch_s"] / df["step_s"] - 1
    numel = int(plan.get("numel", 0))
    ratio = []
    for n, m, c_s in zip(df["nodes"], df["workers_per_node"], df["compute_only_step_s"]):
        bw = (sizes.get((n, m)) or {}).get("inter_node_bandwidth")
        link_s = sm.dense_link_s(numel, n, m, parse_bandwidth(bw) if bw and n > 1 else None)
        ratio.append(link_s / c_s if c_s and c_s > 0 else math.nan)
    df["link_ratio"] = ratio
    return df


def calibration(df: pd.DataFrame) -> dict[tuple[int, int], float]:
    """(nodes, workers per node) -> the size's calibration step (s), where it ran."""
    if "calibration_step_s" not in df.columns:
        return {}
    rows = df[(df["comm"] == sm.NOCOMM) & df["calibration_step_s"].notna()]
    return {(int(n), int(m)): float(c) for n, m, c in
            zip(rows["nodes"], rows["workers_per_node"], rows["calibration_step_s"])}  # fmt: skip


def model_holds(df: pd.DataFrame, within: float = sm.HOLDS_WITHIN) -> bool:
    """Whether every measured step time with a prediction is predicted within ``within``."""
    err = df[df["kind"] == "measured"]["model_error"].dropna()
    return bool(len(err)) and bool((err.abs() <= within).all())


def build_table(records: Sequence[dict[str, Any]], plan: dict[str, Any]) -> pd.DataFrame:
    """Measured rows with predictions, then the projection (``model_holds`` on its rows)."""
    # compute-only warm-ups to leave out: the plan's own count, where it recorded one
    warm = (
        0
        if plan.get("warmup_comm", sm.NOCOMM) != sm.NOCOMM
        else int(plan.get("warmup_runs", sm.OLD_WARMUP_NOCOMM))
    )
    meas = pd.DataFrame(measured_rows(records, int(plan.get("calibration_runs", 0)), warm))
    if meas.empty:
        meas = pd.DataFrame(columns=[c for c in COLUMNS if c != "sweep_id"])
    else:
        meas = with_predictions(efficiency(meas), plan)
        meas = meas.sort_values(["world_size", "nodes", "comm"], kind="stable")
    widest = int(meas["world_size"].max()) if len(meas) else 1
    comms = [c for c in dict.fromkeys(meas["comm"]) if c != sm.NOCOMM] if len(meas) else []
    proj = pd.DataFrame(sm.projected_rows(comms, widest))
    holds = model_holds(meas)
    if len(proj):
        proj["model_holds"] = holds
    df = pd.concat([meas, proj], ignore_index=True) if len(proj) else meas
    df["sweep_id"] = plan.get("sweep_id", "")
    for c in COLUMNS:
        if c not in df.columns:
            df[c] = math.nan
    return df[COLUMNS]


def format_table(df: pd.DataFrame) -> str:
    """The table as printed: measured rows with their predictions, then the projection."""
    if df.empty:
        return "(no rows)"
    cols = ["kind", "nodes", "workers_per_node", "comm", "step_s", "compute_only_step_s",
            "efficiency", "textbook_efficiency", "throughput", "predicted_step_s",
            "model_error"]  # fmt: skip
    show = df[cols].rename(columns={"workers_per_node": "per_node",
                                    "compute_only_step_s": "compute_only_s",
                                    "textbook_efficiency": "textbook",
                                    "predicted_step_s": "predicted_s"})  # fmt: skip
    return show.round(3).to_string(index=False)


def summary(df: pd.DataFrame) -> list[str]:
    """Lines saying whether the model held, where not, and what the projection means."""
    meas = df[df["kind"] == "measured"]
    err = meas.dropna(subset=["model_error"])
    out = []
    if len(err):
        worst = err.loc[err["model_error"].abs().idxmax()]
        out.append(
            f"model vs measured step time: worst {worst['model_error']:+.0%} "
            f"({worst['comm']} on {worst['nodes']}x{worst['workers_per_node']}); "
            f"{int((err['model_error'].abs() <= sm.HOLDS_WITHIN).sum())} of {len(err)} "
            f"within {sm.HOLDS_WITHIN:.0%}"
        )
        off = err[err["model_error"].abs() > sm.HOLDS_WITHIN]
        for r in off.itertuples():
            out.append(f"  off: {r.comm} on {r.nodes}x{r.workers_per_node}: {r.model_error:+.0%}")
        if "calibration_step_s" in meas and meas["calibration_step_s"].notna().any():
            pre = err["model_error_before_launch"].dropna()
            out[0] += " (compute from each size's calibration run)"
            if len(pre):
                out.append(
                    f"with the compute timed before the sweep instead: worst "
                    f"{pre.loc[pre.abs().idxmax()]:+.0%}, "
                    f"{int((pre.abs() <= sm.HOLDS_WITHIN).sum())} of {len(pre)} within "
                    f"{sm.HOLDS_WITHIN:.0%}"
                )
            ref = meas[(meas["comm"] == sm.NOCOMM) & meas["compute_drift"].notna()]
            if len(ref):
                cells = ", ".join(f"{d:+.0%} at {int(n)}x{int(m)}" for n, m, d in
                                  zip(ref["nodes"], ref["workers_per_node"],
                                      ref["compute_drift"]))  # fmt: skip
                out.append(f"compute-only step after the methods vs the calibration run "
                           f"before them: {cells}")  # fmt: skip
    holds = model_holds(df)
    out.append(
        "projection to 16x8 V100 at 25 Gbit/s: "
        + (
            "drawn (the model held at every measured size)"
            if holds
            else "not drawn: the model did not hold at every measured size"
        )  # fmt: skip
    )
    return out
