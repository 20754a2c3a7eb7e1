"""What the figures and the report are drawn from: one results directory, read tolerantly.

Records come from ``<dir>/runs.jsonl`` through :func:`bench.results.records.load_records`
(a torn or malformed line is skipped; its warning, naming file and line, is kept here as a
problem to report).  Records written before a field existed are read with the field
absent.  Each run is reduced to one row of :func:`run_table`: its experiment, its
*configuration* (comm, cache, update), its *cluster* (launcher, nodes x workers per node)
and its hardware, and how it ended.  Runs are compared only within one experiment, cluster
and hardware (:data:`GROUP`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench.results import records as rec
from bench.results.paths import bench_dir

GROUP = ["experiment", "cluster", "hardware"]  # runs compare only inside one such group
CONFIG = ["comm", "cache", "update"]  # a configuration, inside a group
OUTCOMES = ("ok", "target_missed", "diverged")  # runs that trained: each reached or missed
SPARSE = ("topk", "mstopk", "randomk", "hitopk")
OURS = ("hitopk", "mstopk")  # the paper's methods
PEERS = ("fp16", "bf16", "powersgd")  # what a user of PyTorch DDP would pick instead


class NoRecords(Exception):
    """The results directory holds no record to draw from."""


@dataclass
class Inputs:
    """Everything read from one results directory."""

    results_dir: Path
    records: list[dict[str, Any]]
    runs: pd.DataFrame  # :func:`run_table` of the records
    problems: list[str] = field(default_factory=list)  # skipped lines, missing curves
    bench: dict[str, Path] = field(default_factory=dict)  # benchmark name -> its CSV
    ablation: list[Path] = field(default_factory=list)
    scaling: list[Path] = field(default_factory=list)


def load_inputs(results_dir: str | Path) -> Inputs:
    """Read the records, and find the curves and CSVs; :class:`NoRecords` if there are none."""
    d = Path(results_dir)
    if not d.is_dir():
        raise NoRecords(f"{d} is not a directory")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records = rec.load_records(d)
    problems = [str(w.message) for w in caught]
    if not records:
        skipped = (
            f" ({len(problems)} line(s) skipped, the first: {problems[0]})" if problems else ""
        )
        raise NoRecords(f"no run record in {rec.runs_path(d)}{skipped}")
    runs = run_table(records, d)
    problems += [
        f"{r.run_id}: curve {r.curve_path} missing (the record's own numbers are used)"
        for r in runs.itertuples()
        if r.trained and not r.has_curve  # an error record may have no curve
    ]
    problems += older_schema(records)
    return Inputs(
        results_dir=d,
        records=records,
        runs=runs,
        problems=problems,
        bench={p.stem: p for p in sorted(bench_dir(d).glob("*.csv"))},
        ablation=sorted((d / "ablation").glob("*.csv")),
        scaling=sorted((d / "scaling").glob("*.csv")),
    )


def older_schema(records: list[dict[str, Any]]) -> list[str]:
    """One line per set of fields that some records lack (written before they existed)."""
    lacking: dict[tuple[str, ...], list[str]] = {}
    for r in records:
        miss = tuple(f for f in rec.RECORD_FIELDS if f not in r)
        if miss:
            lacking.setdefault(miss, []).append(str(r.get("run_id")))
    return [
        f"{len(ids)} record(s) written before the fields {', '.join(m)} existed "
        f"(read as absent): {', '.join(ids)}"
        for m, ids in lacking.items()
    ]


def num(x: Any) -> float | None:
    """A finite number, or None (absent, null, text, NaN)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _cfg(r: dict[str, Any], group: str, key: str) -> Any:
    c = r.get("config")
    g = c.get(group) if isinstance(c, dict) else None
    return g.get(key) if isinstance(g, dict) else None


def cluster_label(r: dict[str, Any]) -> str:
    """``local 2x2``: the launcher, nodes x workers per node."""
    nnodes = num(r.get("nnodes")) or num(_cfg(r, "cluster", "nnodes"))
    world = num(r.get("world_size"))
    per = num(_cfg(r, "cluster", "nproc_per_node"))
    if per is None and world and nnodes:
        per = world / nnodes
    name = _cfg(r, "cluster", "name") or "?"
    dims = f"{nnodes or 1:g}x{per:g}" if per else f"{nnodes or 1:g} node(s)"
    return f"{name} {dims}{link_label(r) if name == 'emulated' else ''}"


def link_label(r: dict[str, Any]) -> str:
    """An emulated run's link: `` paper-scaled link`` (its profile; the bandwidth the
    profile chose differs a little between sweeps) or `` at 100mbit``."""
    prof = r.get("cluster_profile")
    if isinstance(prof, dict) and prof.get("profile"):
        return f" {prof['profile']}-scaled link"
    bw = _cfg(r, "cluster", "inter_node_bandwidth")
    return f" at {bw}" if bw else ""


def hardware_label(r: dict[str, Any]) -> str:
    """The compute of a record's hardware line (the host is dropped for a GPU)."""
    hw = str(r.get("hardware") or "").split(";")[0].strip()
    return hw or "unknown hardware"


def comm_label(r: dict[str, Any]) -> str:
    """The method, with its density, dense warm-up epochs and per-epoch density schedule
    when it sparsifies (PowerSGD: its rank)."""
    comm = str(r.get("comm") or "?")
    if comm == "powersgd":
        rank = num(_cfg(r, "comm", "powersgd_rank"))
        return comm + (f" r={rank:g}" if rank else "")
    if comm not in SPARSE:
        return comm
    d = num(r.get("comm_density")) or num(_cfg(r, "comm", "density"))
    wu = num(r.get("comm_warmup_epochs")) or 0
    sched = r.get("comm_density_schedule") or _cfg(r, "comm", "density_schedule") or []
    steps = "/".join(f"{x:g}" for x in (num(v) for v in sched) if x is not None)
    return (
        comm
        + (f" d={d:g}" if d else "")
        + (f" wu={wu:g}" if wu else "")
        + (f" schedule {steps}" if steps else "")
    )


def _row(r: dict[str, Any], results_dir: Path) -> dict[str, Any]:
    run_id = str(r.get("run_id"))
    curve = rec.curve_path(results_dir, run_id)
    tt = num(r.get("time_to_target_s"))
    status = str(r.get("status") or "?")
    return {
        "run_id": run_id,
        "experiment": str(r.get("experiment") or _cfg(r, "train", "experiment") or "?"),
        "comm_name": str(r.get("comm") or "?"),
        "comm": comm_label(r),
        "cache": str(r.get("cache") or "?"),
        "update": str(r.get("update") or "?"),
        "cluster": cluster_label(r),
        "hardware": hardware_label(r),
        "hardware_full": str(r.get("hardware") or ""),
        "seed": _cfg(r, "train", "seed"),
        "status": status,
        "trained": status in OUTCOMES,
        "reached": status in OUTCOMES and tt is not None,
        # a tuning-protocol run's role: "tune" runs chose a configuration and are never
        # among the reported numbers (bench.report.report_protocol shows them)
        "protocol_role": str((r.get("protocol") or {}).get("role") or ""),
        "protocol_trial": str((r.get("protocol") or {}).get("trial") or ""),
        "sweep_id": str(_cfg(r, "results", "sweep_id") or ""),
        "time_to_target_s": tt,
        "epochs_to_target": num(r.get("epochs_to_target")),
        "train_time_s": num(r.get("train_time_s")),
        "best_value": num(r.get("best_value")),
        "metric": str(r.get("target_metric") or "?"),
        "target": num(r.get("target_value")),
        "git_sha": r.get("git_sha"),
        "curve_path": curve,
        "has_curve": curve.is_file(),
        # evaluations inside an epoch (train.eval_every_steps): points the curve lacks
        "evals": list(r.get("evals") or []),
    }


def run_table(records: list[dict[str, Any]], results_dir: Path) -> pd.DataFrame:
    """One row per record: identity, group, configuration and outcome."""
    return pd.DataFrame([_row(r, results_dir) for r in records])


def curve(results_dir: Path, run_id: str) -> pd.DataFrame | None:
    """A run's curve with today's column names, or None when it is missing or unreadable."""
    try:
        return rec.load_curve(results_dir, run_id)
    except (OSError, ValueError, pd.errors.ParserError):
        return None


def config_stats(runs: pd.DataFrame) -> pd.DataFrame:
    """Per group and configuration: runs that trained, runs that reached the target, and the
    mean and standard deviation (over seeds) of the time to target of those that reached it."""
    trained = runs[runs["trained"]]
    if "protocol_role" in trained:
        trained = trained[trained["protocol_role"] != "tune"]
    rows = []
    for key, g in trained.groupby(GROUP + CONFIG, sort=True):
        tt = g.loc[g["reached"], "time_to_target_s"].astype(float)
        rows.append(
            {
                **dict(zip(GROUP + CONFIG, key, strict=True)),
                "comm_name": g["comm_name"].iloc[0],
                "n_runs": len(g),
                "n_reached": len(tt),
                "tt_mean": tt.mean() if len(tt) else None,
                "tt_std": tt.std(ddof=1) if len(tt) > 1 else (0.0 if len(tt) else None),
                "run_ids": list(g["run_id"]),
            }
        )
    cols = [*GROUP, *CONFIG, "comm_name", "n_runs", "n_reached", "tt_mean", "tt_std", "run_ids"]
    return pd.DataFrame(rows, columns=cols)


def ratio(base: pd.Series, other: pd.Series) -> tuple[float | None, float | None]:
    """Speedup of ``other`` over ``base`` (mean time ratio) and its standard deviation
    (relative errors added in quadrature); None when either reached the target in no run."""
    bm, om = num(base.get("tt_mean")), num(other.get("tt_mean"))
    if not bm or not om:
        return None, None
    s = bm / om
    rel = math.hypot((num(base.get("tt_std")) or 0.0) / bm, (num(other.get("tt_std")) or 0.0) / om)
    return s, s * rel


def speedups(stats: pd.DataFrame, axis: str, baseline: str) -> pd.DataFrame:
    """Each configuration against the one of its group that differs only in ``axis``,
    set to ``baseline`` (comm ``dense``, cache ``none``, update ``naive``)."""
    if stats.empty:
        return stats.assign(speedup=[], speedup_std=[], baseline=[])
    rest = [c for c in GROUP + CONFIG if c != axis]
    key = "comm_name" if axis == "comm" else axis
    out = []
    for _, g in stats.groupby(rest, sort=True):
        base = g[g[key] == baseline]
        if base.empty:
            continue
        b = base.iloc[0]
        if len(g) < 2:
            continue  # the baseline alone: nothing to compare
        for _, o in g.iterrows():
            s, sd = ratio(b, o)
            base = {"baseline": b[axis], "base_tt": b["tt_mean"], "base_run_ids": b["run_ids"]}
            base |= {"base_reached": b["n_reached"], "base_runs": b["n_runs"]}
            out.append({**o.to_dict(), "speedup": s, "speedup_std": sd, **base})
    return pd.DataFrame(out)
