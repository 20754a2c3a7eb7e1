"""The grid ablation: time to target per (communication, cache, update mode) over seeds,
speed-up over the baseline with first-order error propagation (docs/internals/sweeps.md)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench import methods
from bench.registry import ConfigError
from bench.sweeps.common import (
    check_names,
    job_base,
    options,
    quick_methods,
    sweep_records,
    validate_jobs,
)
from bench.sweeps.resume import RERUN, Saved, latest, pending

CACHES = ("none", "multilevel")
UPDATES = ("naive", "flat")
BASELINE = (methods.names(group="baseline")[0], "none", "naive")  # comm, cache, update


def comms() -> list[str]:
    """The protocol's default methods that are comm hooks (the others have no grid)."""
    return [n for n in methods.defaults() if methods.get(n).kind == "hook"]


def quick() -> dict[str, Any]:
    return {"comm": quick_methods(), "cache": ("none",), "update": ("naive",), "seeds": 1}


COLUMNS = [
    "sweep_id", "experiment", "cluster", "comm", "cache", "update", "n_runs", "n_reached",
    "time_to_target_mean_s", "time_to_target_std_s", "epochs_to_target_mean",
    "throughput_mean", "speedup_vs_baseline", "speedup_std", "run_ids",
    # beyond the columns the report reads: what the target was, failed runs, and the
    # configuration the speedup is against (comm/cache/update)
    "target_metric", "target_value", "n_error", "baseline",
]  # fmt: skip
# the columns of the table the report shows (bench.report)
REPORT_COLUMNS = [
    "experiment", "cluster", "comm", "cache", "update", "n_runs", "n_reached",
    "time_to_target_mean_s", "time_to_target_std_s", "speedup_vs_baseline", "speedup_std",
]  # fmt: skip
# on the local cluster every job runs 2 launcher agents of one worker each: 2 nodes, which
# the paper's hierarchical method needs, for every method alike
LOCAL_TOPOLOGY = ("cluster.nnodes=2", "cluster.nproc_per_node=1")


@dataclass
class Plan(Saved):
    """One ablation sweep, saved at ``<results>/ablation/<sweep_id>.grid.json``."""

    FOLDER, SUFFIX, WHAT = "ablation", ".grid.json", "grid"

    sweep_id: str
    experiment: str = "dawnbench_digits"
    cluster: str = "emulated"
    comms: Sequence[str] = field(default_factory=comms)
    caches: Sequence[str] = CACHES
    updates: Sequence[str] = UPDATES
    seeds: int = 3
    results_dir: str = "results"
    cluster_overrides: Sequence[str] = ()  # e.g. cluster.profile=paper (common.cluster_profile)
    extra: Sequence[str] = ()  # further Hydra overrides, applied to every job
    launcher: str = ""  # "" = the local run queue, else a Hydra launcher (bench.launch.submit)
    launcher_overrides: Sequence[str] = ()
    notes: list[str] = field(default_factory=list)

    def check_names(self) -> None:
        check_names("experiment", [self.experiment], options("experiment"))
        check_names("cluster", [self.cluster], options("cluster"))
        check_names("comm", list(self.comms), methods.names(kind="hook"))
        check_names("cache", list(self.caches), options("cache"))
        check_names("update", list(self.updates), ("naive", "foreach", "fused", "flat"))
        if self.seeds < 1:
            raise ConfigError(f"--seeds must be >= 1, got {self.seeds}")

    def check_jobs(self) -> None:
        jobs = [self.job_overrides(*job, seed=0) for job in self.configs()]
        cfg = validate_jobs(jobs, self.results_dir)[-1]
        if "multilevel" in self.caches and cfg.data.name not in ("imagefolder", "imagenet"):
            same = f"on data={cfg.data.name} cache=multilevel trains on the same in-memory input"
            if "none" in self.caches:  # the same runs twice: not run
                self.caches = [c for c in self.caches if c != "multilevel"]
                self.notes.append(
                    f"cache=multilevel dropped from the grid: {same} as cache=none (the cache "
                    "levels act on image-folder data only)"
                )
            else:
                self.notes.append(
                    f"the cache levels act on image-folder data only: {same} as cache=none"
                )

    def configs(self) -> list[tuple[str, str, str]]:
        return list(itertools.product(self.comms, self.caches, self.updates))

    def job_overrides(self, comm: str, cache: str, update: str, seed: int) -> list[str]:
        return [
            *job_base(self, LOCAL_TOPOLOGY),
            *methods.get(comm).overrides(),
            f"cache={cache}",
            f"optim.update={update}",
            f"train.seed={seed}",
        ]

    def keys(self) -> list[tuple[str, str, str, int]]:
        seeds_configs = itertools.product(range(self.seeds), self.configs())
        return [(c, k, u, s) for s, (c, k, u) in seeds_configs]

    def jobs(self) -> list[list[str]]:
        """Seed by seed (load that drifts hits every configuration alike)."""
        return [self.job_overrides(c, k, u, s) for c, k, u, s in self.keys()]

    def pending(self, rerun: Sequence[str] = RERUN) -> list[int]:
        return pending(self.keys(), sweep_records(self.results_dir, self.sweep_id), key_of, rerun)

    def run(
        self, sweep_dir: str | Path, runner: Callable[..., list[int]], rerun: Sequence[str] = RERUN
    ) -> list[int]:
        jobs = self.jobs()
        return runner([jobs[i] for i in self.pending(rerun)], sweep_dir, self.experiment)


def key_of(rec: Mapping[str, Any]) -> tuple[str, str, str, int] | None:
    """A grid record's job key; None for a protocol run."""
    if (rec.get("protocol") or {}).get("role"):
        return None
    seed = ((rec.get("config") or {}).get("train") or {}).get("seed")
    if seed is None:
        return ("run", str(rec.get("run_id")), "", -1)
    return (*_config_of(rec), int(seed))


def _config_of(rec: Mapping[str, Any]) -> tuple[str, str, str]:
    return str(rec.get("comm")), str(rec.get("cache")), str(rec.get("update"))


def _stats(recs: list[dict[str, Any]]) -> dict[str, Any]:
    reached = [r for r in recs if r.get("time_to_target_s") is not None]
    times = pd.Series([float(r["time_to_target_s"]) for r in reached], dtype=float)
    epochs = pd.Series([float(r["epochs_to_target"]) for r in reached], dtype=float)
    thr = pd.Series(
        [float(r["throughput_samples_per_s"]) for r in recs if r.get("throughput_samples_per_s")],
        dtype=float,
    )
    return {
        "n_runs": len(recs),
        "n_reached": len(reached),
        "time_to_target_mean_s": times.mean() if len(times) else math.nan,
        "time_to_target_std_s": times.std(ddof=1) if len(times) > 1 else math.nan,
        "epochs_to_target_mean": epochs.mean() if len(epochs) else math.nan,
        "throughput_mean": thr.mean() if len(thr) else math.nan,
        "run_ids": " ".join(str(r["run_id"]) for r in recs),
        "n_error": sum(r.get("status") == "error" for r in recs),
    }


def speedup(base: dict[str, Any], row: dict[str, Any]) -> tuple[float, float]:
    """(mean-time ratio, its propagated standard error)."""
    mb, mc = base["time_to_target_mean_s"], row["time_to_target_mean_s"]
    if not (mb > 0 and mc > 0):  # NaN (nothing reached the target) or a zero time
        return math.nan, math.nan
    s = mb / mc
    if base is row:
        return 1.0, 0.0
    nb, nc = base["n_reached"], row["n_reached"]
    if nb < 2 or nc < 2:
        return s, math.nan
    rel_b = base["time_to_target_std_s"] / math.sqrt(nb) / mb
    rel_c = row["time_to_target_std_s"] / math.sqrt(nc) / mc
    return s, s * math.sqrt(rel_b**2 + rel_c**2)


def aggregate(
    records: Sequence[dict[str, Any]], sweep_id: str, baseline: tuple[str, str, str] = BASELINE
) -> pd.DataFrame:
    """One row per configuration found in ``records`` (each job's latest record)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in latest(records, key_of).values():
        groups.setdefault(_config_of(r), []).append(r)
    rows = {}
    for key in sorted(groups, key=lambda k: (k != baseline, k)):
        recs = groups[key]
        first = recs[0]
        cluster = ((first.get("config") or {}).get("cluster") or {}).get("name", "")
        rows[key] = {
            "sweep_id": sweep_id,
            "experiment": first.get("experiment"),
            "cluster": cluster,
            "comm": key[0],
            "cache": key[1],
            "update": key[2],
            "target_metric": first.get("target_metric"),
            "target_value": first.get("target_value"),
            **_stats(recs),
        }
    for key, row in rows.items():
        # a sweep narrowed by --cache or --update: the baseline method at its own cache, update
        bkey = baseline if baseline in rows else (baseline[0], key[1], key[2])
        base = rows.get(bkey)
        s, sd = speedup(base, row) if base is not None else (math.nan, math.nan)
        row["speedup_vs_baseline"], row["speedup_std"] = s, sd
        row["baseline"] = "/".join(bkey) if base is not None else ""
    return pd.DataFrame(list(rows.values()), columns=COLUMNS)


def format_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "(no records)"
    show = pd.DataFrame(
        {
            "comm": df["comm"],
            "cache": df["cache"],
            "update": df["update"],
            "reached": [f"{a}/{b}" for a, b in zip(df["n_reached"], df["n_runs"])],
            "tta_s": [
                _pm(m, s, 1)
                for m, s in zip(df["time_to_target_mean_s"], df["time_to_target_std_s"])
            ],
            "epochs": df["epochs_to_target_mean"].round(1),
            "samples/s": df["throughput_mean"].round(0),
            "speedup": [_pm(m, s, 2) for m, s in zip(df["speedup_vs_baseline"], df["speedup_std"])],
        }
    )
    return show.to_string(index=False)


def _pm(mean: float, std: float, digits: int) -> str:
    if mean != mean:  # NaN
        return "-"
    return f"{mean:.{digits}f}" + ("" if std != std else f" +- {std:.{digits}f}")
