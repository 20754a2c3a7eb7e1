"""The scaling study's table: per (size, method) the step time over the rounds, the
efficiency against the size's compute-only runs, the model's prediction beside them, and
the projection to the paper's cluster; every column: docs/internals/report.md.  An
efficiency above 1 reads by one rule (:func:`above_one`) in the note, figure and report.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from bench import methods
from bench.cluster.netns import parse_bandwidth
from bench.results.columns import EPOCH_TIME, SAMPLES, STEPS
from bench.results.records import read_curve
from bench.sweeps import scaling_model as sm
from bench.sweeps.intervals import ci_text, log_mean_interval, log_t_interval
from bench.sweeps.scaling import CALIBRATION_SEED, SEED, key_of

COLUMNS = [
    "sweep_id", "kind", "cluster", "nodes", "workers_per_node", "world_size", "comm",
    "density", "n_runs", "step_s", "step_s_ci_low", "step_s_ci_high", "compute_only_step_s",
    "efficiency", "efficiency_ci_low", "efficiency_ci_high", "textbook_efficiency",
    "throughput", "predicted_step_s", "predicted_efficiency", "model_error",
    "calibration_step_s", "compute_drift", "predicted_before_launch_s",
    "model_error_before_launch", "efficiency_min", "efficiency_max", "model_holds",
    "inter_node_bandwidth", "target_ratio", "link_ratio", "measured_steps", "run_id", "note",
]  # fmt: skip
# the columns of the table the report shows (bench.report.answer)
REPORT_COLUMNS = [
    "kind", "nodes", "workers_per_node", "comm", "n_runs", "step_s", "compute_only_step_s",
    "efficiency", "efficiency_ci_low", "efficiency_ci_high", "textbook_efficiency",
    "throughput", "predicted_step_s", "model_error", "inter_node_bandwidth", "link_ratio",
    # an older table's names (before the compute-only reference)
    "nnodes", "nproc_per_node", "throughput_samples_per_s", "run_id",
]  # fmt: skip
HOLDS_ONE, FAULT = "holds 1", "fault"
ABOVE_ONE = {
    HOLDS_ONE: "above 1, its interval holding 1: as fast as computing alone within the "
    "runs' spread, not faster",
    FAULT: "above 1 beyond its interval (or with none): a measurement fault, not a gain "
    "(no exchange makes a step faster than computing alone: the compute-only runs that "
    "set 1 ran slow at that size)",
}


def above_one(eff: float, low: float, high: float) -> str:
    """``""`` at or below 1 as printed, :data:`HOLDS_ONE` when its interval holds 1, else
    :data:`FAULT`."""
    if not eff == eff or round(eff, 2) <= 1.0:
        return ""
    return HOLDS_ONE if low == low and low <= 1.0 else FAULT


def above_one_of(df: pd.DataFrame) -> pd.Series:
    """:func:`above_one` of each row (a table without intervals: none)."""
    lo = df.get("efficiency_ci_low", pd.Series(math.nan, index=df.index))
    hi = df.get("efficiency_ci_high", pd.Series(math.nan, index=df.index))
    return pd.Series([above_one(*map(float, v)) for v in zip(df["efficiency"], lo, hi)],
                     index=df.index, dtype=object)  # fmt: skip


def point_text(r: Mapping[str, Any]) -> str:
    """``0.52 [0.48, 0.55] at 2x2``: a row's efficiency, its interval, and its size."""
    lo, hi = r.get("efficiency_ci_low"), r.get("efficiency_ci_high")
    eff = ci_text(r["efficiency"], lo, hi, plain=True)
    return f"{eff} at {int(r['nodes'])}x{int(r['workers_per_node'])}"


def above_one_lines(df: pd.DataFrame) -> list[str]:
    """A line per kind of measured point above 1: each point, then what the kind means."""
    meas = df[df["kind"] == "measured"] if "kind" in df.columns else df
    flag, out = above_one_of(meas), []
    for f, text in ABOVE_ONE.items():
        pts = [f"{r['comm']} {point_text(r)}" for _, r in meas[flag == f].iterrows()]
        if pts:
            out.append(f"{f}: {', '.join(pts)}: {text}")
    return out


def run_timing(rec: Mapping[str, Any], warm: int = 1) -> tuple[float, float, int]:
    """(s per step, samples per s, steps) over a run's epochs after the first ``warm``
    (a single epoch: that one); NaNs without a curve."""
    curve = rec.get("curve")
    if not curve or not Path(curve).is_file():
        return math.nan, math.nan, 0
    df = read_curve(curve)
    if df.empty or not {EPOCH_TIME, STEPS, SAMPLES} <= set(df.columns):
        return math.nan, math.nan, 0
    later = df.iloc[warm:] if len(df) > warm else df.iloc[-1:]
    secs, steps = float(later[EPOCH_TIME].sum()), int(later[STEPS].sum())
    if secs <= 0 or steps < 1:
        return math.nan, math.nan, 0
    return secs / steps, float(later[SAMPLES].sum()) / secs, steps


def measured_rows(
    records: Sequence[Mapping[str, Any]], plan: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """A row per (size, method) with a finished run in a round (its latest), its step
    times in ``times``; a size's calibration run gives its compute-only row's
    ``calibration_step_s``; warm-ups are left out."""
    sched = plan.get("schedule") or {}
    ok = ("ok", "target_missed")
    latest = {k: r for r in records if r.get("status") in ok and (k := key_of(r))}
    runs: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    cal: dict[tuple[int, int], float] = {}
    for (n, m, comm, seed), r in sorted(latest.items(), key=lambda kv: kv[0][3]):
        step, thr, steps = run_timing(r, int((sched.get(comm) or (1, 0))[0]))
        if seed == CALIBRATION_SEED and comm == sm.NOCOMM:
            cal[(n, m)] = step
        elif seed >= SEED and step == step:
            cl = (r.get("config") or {}).get("cluster") or {}
            spec = methods.of(r)
            h = spec.period(spec.knobs_of(r.get("config") or {})) if spec else 1
            note = f"measured {steps} steps, not whole periods of {h}" if steps % h else ""
            runs.setdefault((n, m, comm), []).append({
                "step": step, "thr": thr, "steps": steps, "run_id": str(r.get("run_id")),
                "cluster": cl.get("name", ""), "note": note,
                "bw": cl.get("inter_node_bandwidth") if n > 1 else "",
                "ratio": (r.get("cluster_profile") or {}).get("target_ratio", math.nan),
            })  # fmt: skip
    rows = []
    for (n, m, comm), rs in runs.items():
        step, lo, hi = log_mean_interval([x["step"] for x in rs])
        rows.append({
            "kind": "measured", "cluster": rs[-1]["cluster"], "nodes": n,
            "workers_per_node": m, "world_size": n * m, "comm": comm, "n_runs": len(rs),
            "step_s": step, "step_s_ci_low": lo, "step_s_ci_high": hi,
            "times": [x["step"] for x in rs],
            "throughput": sum(x["thr"] for x in rs) / len(rs),
            "measured_steps": max(x["steps"] for x in rs),
            "inter_node_bandwidth": rs[-1]["bw"], "target_ratio": rs[-1]["ratio"],
            "calibration_step_s": cal.get((n, m), math.nan) if comm == sm.NOCOMM else math.nan,
            "run_id": " ".join(x["run_id"] for x in rs),
            "note": "; ".join(dict.fromkeys(x["note"] for x in rs if x["note"])),
        })  # fmt: skip
    return rows


def efficiency(df: pd.DataFrame) -> pd.DataFrame:
    """``efficiency`` (:func:`log_t_interval` of the size's compute-only step times over
    the method's; 1 for the compute-only row), ``textbook_efficiency`` and
    ``compute_drift`` of measured rows."""
    df = df.copy()
    ref = df[df["comm"] == sm.NOCOMM].set_index(["nodes", "workers_per_node"])
    cells = []
    for n, m, comm, times in zip(df["nodes"], df["workers_per_node"], df["comm"], df["times"]):
        if (n, m) not in ref.index:
            cells.append((math.nan,) * 3)
        elif comm == sm.NOCOMM:
            cells.append((1.0, math.nan, math.nan))
        else:
            cells.append(log_t_interval(ref.loc[(n, m), "times"], times))
    df["efficiency"], df["efficiency_ci_low"], df["efficiency_ci_high"] = zip(*cells)
    keys = list(zip(df["nodes"], df["workers_per_node"]))
    df["compute_only_step_s"] = [float(ref["step_s"].get(k, math.nan)) for k in keys]
    one = df[(df["world_size"] == 1) & (df["comm"] == sm.NOCOMM)]["throughput"]
    base = float(one.iloc[0]) if len(one) else math.nan
    df["textbook_efficiency"] = df["throughput"] / (df["world_size"] * base)
    df["compute_drift"] = df["step_s"] / df["calibration_step_s"] - 1
    return df


def with_predictions(df: pd.DataFrame, plan: Mapping[str, Any]) -> pd.DataFrame:
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
    # the model's compute input at each size: its calibration run (else the timing before
    # the launch); the model's step is compute + exposed aggregation + update
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
    if "calibration_step_s" not in df.columns:
        return {}
    rows = df[(df["comm"] == sm.NOCOMM) & df["calibration_step_s"].notna()]
    return {(int(n), int(m)): float(c) for n, m, c in
            zip(rows["nodes"], rows["workers_per_node"], rows["calibration_step_s"])}  # fmt: skip


def model_holds(df: pd.DataFrame, within: float = sm.HOLDS_WITHIN) -> bool:
    """Whether every measured step time with a prediction is predicted within ``within``."""
    err = df[df["kind"] == "measured"]["model_error"].dropna()
    return bool(len(err)) and bool((err.abs() <= within).all())


def build_table(records: Sequence[Mapping[str, Any]], plan: Mapping[str, Any]) -> pd.DataFrame:
    """Measured rows with predictions, then the projection (``model_holds`` on its rows)."""
    meas = pd.DataFrame(measured_rows(records, plan))
    if meas.empty:
        meas = pd.DataFrame(columns=[c for c in COLUMNS if c != "sweep_id"])
    else:
        meas = with_predictions(efficiency(meas), plan).drop(columns="times")
        meas = meas.sort_values(["world_size", "nodes", "comm"], kind="stable")
        flag = above_one_of(meas)
        meas["note"] = [
            "; ".join(x for x in (note, ABOVE_ONE.get(f, "")) if x)
            for note, f in zip(meas["note"], flag)
        ]
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
    if df.empty:
        return "(no rows)"
    show = pd.DataFrame({
        "kind": df["kind"], "nodes": df["nodes"], "per_node": df["workers_per_node"],
        "comm": df["comm"], "n": df["n_runs"].map(lambda v: "" if v != v else f"{v:.0f}"),
        "step_s [95% CI]": [ci_text(*v, 3, plain=True) for v in
                            zip(df["step_s"], df["step_s_ci_low"], df["step_s_ci_high"])],
        "efficiency [95% CI]": [ci_text(*v, 2, plain=True) for v in zip(
            df["efficiency"], df["efficiency_ci_low"], df["efficiency_ci_high"])],
        "above_1": above_one_of(df).where(df["kind"] == "measured", ""),
        "textbook": df["textbook_efficiency"].round(2),
        "predicted_s": df["predicted_step_s"].round(3),
        "model_error": df["model_error"].map(lambda v: "" if v != v else f"{v:+.0%}"),
    })  # fmt: skip
    return show.to_string(index=False)


def summary(df: pd.DataFrame) -> list[str]:
    """Lines saying how the points above 1 read and whether the model held."""
    meas = df[df["kind"] == "measured"]
    err = meas.dropna(subset=["model_error"])
    out = above_one_lines(meas)
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
            out[-1 - len(off)] += " (compute from each size's calibration run)"
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
                out.append(f"compute-only step over the rounds vs the calibration run "
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
