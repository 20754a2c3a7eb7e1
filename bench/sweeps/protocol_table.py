"""The protocol sweep's table, ``<results>/ablation/<sweep_id>.csv``: one row per evaluated
configuration and cluster; columns: docs/internals/report.md."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from bench import methods
from bench.sweeps import carryover as co
from bench.sweeps import intervals as iv
from bench.sweeps.measured import kind_of, other_kind
from bench.sweeps.protocol import (
    EVAL,
    TUNE,
    Plan,
    clusters,
    extend,
    job_of,
    pending,
    recorded,
    run_of,
    select_per_cluster,
    selection_table,
)
from bench.sweeps.ratios import corners, run_time_s
from bench.sweeps.resume import RERUN_FAILED

COLUMNS = [
    "sweep_id", "protocol", "experiment", "for_cluster", "ratio", "comm", "trial",
    "measured_on", "n_runs", "n_reached", "n_error", "time_to_target_mean_s",
    "time_to_target_ci_low_s", "time_to_target_ci_high_s", "steps_to_target_mean",
    "tuning_median_s", "steps_nodes", "steps_factor", "steps_factor_ci_low",
    "steps_factor_ci_high", "speedup_vs_dense", "speedup_vs_dense_ci_low",
    "speedup_vs_dense_ci_high", "verdict_vs_dense", "seed_correlation_vs_dense", "best_peer",
    "speedup_vs_peer", "speedup_vs_peer_ci_low", "speedup_vs_peer_ci_high", "verdict_vs_peer",
    "seed_correlation_vs_peer", "target_metric", "target_value", "order_seed", "seeds",
    "run_ids", "kept_out",
]  # fmt: skip


def _mean(vals: Sequence[Any]) -> float:
    xs = [float(v) for v in vals if v is not None]
    return sum(xs) / len(xs) if xs else math.nan


def tuning_gaps(
    plan: Plan, records: Sequence[Mapping[str, Any]], tuning: pd.DataFrame | None = None
) -> list[str]:
    """Why the data the selection rests on is not whole (none: it is); a tuning table, and
    the evaluation table selected by it, with any is partial."""
    jobs = [*plan.tune_jobs(), *plan.timing_jobs(), *extend(plan, records).jobs]
    left = pending(jobs, records, RERUN_FAILED)
    if left:  # the medians are blank for want of these
        return [f"{len(left)} of {len(jobs)} tuning, timing and rate-extension runs lack a "
                "record or failed"]  # fmt: skip
    if tuning is None:
        tuning = selection_table(plan, records)
    blank = tuning[tuning["median_time_s"].isna() & (tuning["n_runs"] > 0)]
    where = [" ".join(str(r.get(k, "")) for k in ("comm", "trial", "cluster")).strip()
             for _, r in blank.head(3).iterrows()]  # fmt: skip
    more = ", ..." if len(blank) > len(where) else ""
    return [f"no median time for {len(blank)} trial(s): {', '.join(where)}{more}"] if where else []


def format_table(df: pd.DataFrame) -> str:
    """The table as printed: one block per cluster."""
    if df.empty:
        return "(no evaluation records)"
    out = []
    for cluster, g in df.groupby("for_cluster", sort=False):
        ratio = g["ratio"].iloc[0]
        how = "measured on its clock" if ratio != ratio else f"composed at ratio {ratio:.2f}"
        peers = [f" ({p})" if p else "" for p in g["best_peer"]]
        vs_peer = iv.ci_column(g, "speedup_vs_peer", 2, plain=True)
        show = pd.DataFrame(
            {
                "comm": g["comm"],
                "trial": g["trial"],
                "reached": [f"{a}/{b}" for a, b in zip(g["n_reached"], g["n_runs"])],
                "tta_s [95 %]": iv.ci_column(g, "time_to_target", 1, plain=True),
                "vs dense": iv.ci_column(g, "speedup_vs_dense", 2, plain=True),
                "vs best peer": [c + p for c, p in zip(vs_peer, peers)],
                "verdict vs dense / peer": [
                    f"{a} / {b}" for a, b in zip(g["verdict_vs_dense"], g["verdict_vs_peer"])
                ],
            }
        )
        out += [f"{cluster} ({how}):", show.to_string(index=False)]
    return "\n".join(out)


def aggregate(plan: Plan, records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Per cluster and method: the selected configuration's time to target on the
    evaluation seeds, and its speedup over dense and over the best peer (lowest median
    tuning time there), Welch intervals on log time (unpaired: the seed correlation says
    whether pairing could narrow them).  ``records``: :func:`measured.counted`'s; an
    evaluation run on another CPU kind counts in the projections only, and a measured
    cluster's row names it in ``kept_out``."""
    peer_names, dense = methods.peers(), methods.names(group="baseline")[0]
    done = recorded(records)
    evals = [r for r in done.values() if (r.get("protocol") or {}).get("role") == EVAL]
    budget = iv.budget_s(  # a miss counts at the longest tuning or evaluation run
        [r for r in done.values() if (r.get("protocol") or {}).get("role") in (TUNE, EVAL)]
    )
    table = selection_table(plan, records)
    chosen = select_per_cluster(table)
    # projections whose steps do not carry over to 8 nodes as dense's do: their factor
    factors = co.step_factors(co.table(co.runs(plan, records)))
    every: dict[str, dict[str, dict[int, float]]] = {}  # cluster -> method -> seed -> s
    bands: dict[str, dict[str, list[list[float]]]] = {}  # cluster -> method -> corner -> s
    rows: list[dict[str, Any]] = []
    for cluster, ratio in clusters(plan).items():
        sel = chosen.get(cluster, {})
        tuned = table[(table["cluster"] == cluster) & table["selected"]]
        med = {str(r["comm"]): float(r["median_time_s"]) for _, r in tuned.iterrows()}
        peers = [c for c in sel if c in peer_names and not math.isnan(med.get(c, math.nan))]
        best = min(peers, key=lambda c: med[c]) if peers else ""
        times: dict[str, dict[int, float]] = {}
        block: dict[str, dict[str, Any]] = {}
        for comm in plan.comms:
            trial = sel.get(comm)
            # on a measured cluster its runs there; projected: one run per seed, wherever
            by_seed = {
                job_of(r).seed: r  # type: ignore[union-attr]
                for r in evals
                if job_of(r).comm == comm  # type: ignore[union-attr]
                and r["protocol"]["trial"] == trial
                and (ratio is not None or job_of(r).where == cluster)  # type: ignore[union-attr]
            }
            out = {s: r for s, r in by_seed.items() if ratio is None and other_kind(plan, r)}
            by_seed = {s: r for s, r in by_seed.items() if s not in out}  # on another clock
            # a projection scales its steps by how they carry over to 8 nodes, against dense's
            f = factors.get((comm, str(trial)), (1.0, 1.0, 1.0)) if ratio is not None else None
            mine = [by_seed[s] for s in sorted(by_seed)]
            if trial is None or not mine:
                continue
            good = [r for r in mine if r.get("status") in ("ok", "target_missed")]
            # seed -> time to target (its clock, else the model's; a miss: its whole run)
            t: dict[int, float] = {}
            band: list[list[float]] = []  # per corner of the assumptions x the factor's interval
            steps = []
            for r in good:  # an error run has no time
                if ratio is None:
                    t[job_of(r).seed] = iv.censored_time(r, budget)  # type: ignore[union-attr]
                elif run := run_of(plan, r):
                    t[job_of(r).seed] = run_time_s(run, ratio) * f[0]  # type: ignore[index, union-attr]
                    band.append([run_time_s(run, ratio, **c) * x for c in corners() for x in f])  # type: ignore[union-attr]
                else:
                    continue
                if r.get("steps_to_target") is not None:
                    steps.append(float(r["steps_to_target"]))
            if t:
                times[comm] = t
                if band:
                    bands.setdefault(cluster, {})[comm] = [list(c) for c in zip(*band)]
            m, lo, hi = iv.mean_interval(list(t.values()))
            first = mine[0]
            block[comm] = {
                "sweep_id": plan.sweep_id,
                "protocol": plan.name,
                "experiment": first.get("experiment"),
                "for_cluster": cluster,
                "ratio": math.nan if ratio is None else ratio,
                "comm": comm,
                "trial": trial,
                "measured_on": "clock" if ratio is None else "model",
                "n_runs": len(mine),
                "n_reached": sum(r.get("time_to_target_s") is not None for r in mine),
                "n_error": sum(r.get("status") == "error" for r in mine),
                "time_to_target_mean_s": m,
                "time_to_target_ci_low_s": lo,
                "time_to_target_ci_high_s": hi,
                "steps_to_target_mean": _mean(steps),
                "tuning_median_s": med.get(comm, math.nan),
                "steps_nodes": co.BASE_NODES,
                **dict(
                    zip(
                        ("steps_factor", "steps_factor_ci_low", "steps_factor_ci_high"),
                        f or (math.nan,) * 3,
                        strict=True,
                    )
                ),  # fmt: skip
                "target_metric": first.get("target_metric"),
                "target_value": first.get("target_value"),
                "order_seed": plan.order_seed,
                "seeds": " ".join(str(s) for s in t),
                "run_ids": " ".join(str(r["run_id"]) for r in mine),
                "kept_out": kept_out_cell(
                    [(s, r["run_id"], kind_of(r)) for s, r in sorted(out.items())]
                ),
            }
        every[cluster] = times
        for comm, row in block.items():
            for ref, vs in ((dense, "vs_dense"), (best, "vs_peer")):  # the columns' suffix
                if ref in times and comm in times and ref != comm:
                    a, b = times[ref], times[comm]
                    r, lo, hi = iv.log_t_interval(list(a.values()), list(b.values()))
                    verdict = iv.verdict(lo, hi, min(len(a), len(b)))
                    rho = iv.seed_correlation(a, b)
                else:
                    r = lo = hi = rho = math.nan
                    verdict = ""
                row[f"speedup_{vs}"], row[f"verdict_{vs}"] = r, verdict
                row[f"speedup_{vs}_ci_low"], row[f"speedup_{vs}_ci_high"] = lo, hi
                row[f"seed_correlation_{vs}"] = rho
            row["best_peer"] = best
            rows.append(row)
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs["times"] = every  # the per-seed times behind each row (the tie rule reads them)
    df.attrs["corners"] = bands  # a projection's, at each corner (the tie rule's band)
    return df


def kept_out_cell(runs: Sequence[tuple[int, str, str]]) -> str:
    """A measured row's ``kept_out``: "seed S: RUN_ID on KIND; ..." ("" for none)."""
    return "; ".join(f"seed {s}: {rid} on {kind}" for s, rid, kind in runs)


def kept_out_runs(row: Mapping[str, Any]) -> list[tuple[int, str, str]]:
    """(seed, run id, CPU kind) of each run a table row keeps out (none: an older table)."""
    cell = row.get("kept_out")
    found = re.findall(r"seed (\d+): (\S+) on ([^;]+)", cell if isinstance(cell, str) else "")
    return [(int(s), rid, kind.strip()) for s, rid, kind in found]


def leading(df: pd.DataFrame) -> dict[str, tuple[str, ...]]:
    """Per cluster, the first method or the tied group (:func:`intervals.leaders`): on a
    projected cluster told apart under the seed interval and at every corner of the model's
    assumptions and the steps factor's interval, as the answer tells them."""
    bands = df.attrs.get("corners", {})
    return {
        cluster: iv.leaders(
            [
                {
                    "method": m,
                    "times": list(t.values()),
                    "corners": bands.get(cluster, {}).get(m, []),
                }
                for m, t in ts.items()
            ]
        ).tied  # fmt: skip
        for cluster, ts in df.attrs.get("times", {}).items()
    }
