"""The protocol sweep's table, ``<results>/ablation/<sweep_id>.csv``, from its records: one
row per evaluated configuration with its time to target, speedups over dense and over the
best peer (95 % intervals, verdicts) and the runs behind it; columns:
docs/internals/report.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from bench.sweeps import intervals as iv
from bench.sweeps.protocol import EVAL, PAPER_METHODS, Plan, job_of, method_of, recorded

COLUMNS = [
    "sweep_id", "protocol", "experiment", "cluster", "comm", "trial", "n_runs", "n_reached",
    "n_error", "time_to_target_mean_s", "time_to_target_ci_low_s", "time_to_target_ci_high_s",
    "budget_s", "steps_to_target_mean", "step_time_mean_s", "speedup_vs_dense",
    "speedup_vs_dense_ci_low", "speedup_vs_dense_ci_high", "verdict_vs_dense", "best_peer",
    "speedup_vs_peer", "speedup_vs_peer_ci_low", "speedup_vs_peer_ci_high", "verdict_vs_peer",
    "target_metric", "target_value", "order_seed", "seeds", "run_ids",
]  # fmt: skip


def _mean(vals: Sequence[Any]) -> float:
    xs = [float(v) for v in vals if v is not None]
    return sum(xs) / len(xs) if xs else math.nan


def _compare(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float, int]:
    """mean(a) / mean(b) with its interval, paired by seed when both ran the same seeds."""
    paired = sorted(a) == sorted(b)
    seeds_a, seeds_b = sorted(a), sorted(b)
    r, lo, hi = iv.ratio_interval([a[s] for s in seeds_a], [b[s] for s in seeds_b], paired=paired)
    return r, lo, hi, min(len(a), len(b))


def aggregate(plan: Plan, records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The table of ``plan``'s evaluation runs found in ``records``."""
    done = recorded(records)
    evals = [r for r in done.values() if (r.get("protocol") or {}).get("role") == EVAL]
    budget = iv.budget_s(list(done.values()))  # tuning and evaluation runs alike
    times: dict[str, dict[int, float]] = {}
    rows: dict[str, dict[str, Any]] = {}
    for comm in plan.comms:
        mine = sorted(
            (r for r in evals if method_of(r) == comm),
            key=lambda r: job_of(r).seed,  # type: ignore[union-attr]
        )
        if not mine:
            continue
        by_seed = {job_of(r).seed: iv.censored_time(r, budget) for r in mine}  # type: ignore[union-attr]
        times[comm] = by_seed
        m, lo, hi = iv.mean_interval(list(by_seed.values()))
        first = mine[0]
        rows[comm] = {
            "sweep_id": plan.sweep_id,
            "protocol": plan.name,
            "experiment": first.get("experiment"),
            "cluster": ((first.get("config") or {}).get("cluster") or {}).get("name", ""),
            "comm": comm,
            "trial": first["protocol"]["trial"],
            "n_runs": len(mine),
            "n_reached": sum(r.get("time_to_target_s") is not None for r in mine),
            "n_error": sum(r.get("status") == "error" for r in mine),
            "time_to_target_mean_s": m,
            "time_to_target_ci_low_s": lo,
            "time_to_target_ci_high_s": hi,
            "budget_s": budget,
            "steps_to_target_mean": _mean([r.get("steps_to_target") for r in mine]),
            "step_time_mean_s": _mean([r.get("step_time_s") for r in mine]),
            "target_metric": first.get("target_metric"),
            "target_value": first.get("target_value"),
            "order_seed": plan.order_seed,
            "seeds": " ".join(str(s) for s in by_seed),
            "run_ids": " ".join(str(r["run_id"]) for r in mine),
        }
    peers = [c for c in times if c not in PAPER_METHODS]
    best = min(peers, key=lambda c: rows[c]["time_to_target_mean_s"]) if peers else None
    for comm, row in rows.items():
        for ref, tag in (("dense" if "dense" in times else None, "dense"), (best, "peer")):
            if ref is None:
                r = lo = hi = math.nan
                n = 0
            else:
                r, lo, hi, n = _compare(times[ref], times[comm])
            row[f"speedup_vs_{tag}"] = r
            row[f"speedup_vs_{tag}_ci_low"] = lo
            row[f"speedup_vs_{tag}_ci_high"] = hi
            row[f"verdict_vs_{tag}"] = iv.verdict(lo, hi, n) if ref is not None else ""
        row["best_peer"] = best or ""
    return pd.DataFrame(list(rows.values()), columns=COLUMNS)


def format_table(df: pd.DataFrame) -> str:
    """The table as printed: times in s and ratios with their 95 % intervals."""
    if df.empty:
        return "(no evaluation records)"
    peers = [f" ({p})" if p else "" for p in df["best_peer"]]
    show = pd.DataFrame(
        {
            "comm": df["comm"],
            "trial": df["trial"],
            "reached": [f"{a}/{b}" for a, b in zip(df["n_reached"], df["n_runs"])],
            "tta_s [95 %]": iv.ci_column(df, "time_to_target", 1, plain=True),
            "vs dense": iv.ci_column(df, "speedup_vs_dense", 2, plain=True),
            "vs best peer": [
                c + p for c, p in zip(iv.ci_column(df, "speedup_vs_peer", 2, plain=True), peers)
            ],
            "verdict vs dense / peer": [
                f"{a} / {b}" for a, b in zip(df["verdict_vs_dense"], df["verdict_vs_peer"])
            ],
        }
    )
    return show.to_string(index=False)
