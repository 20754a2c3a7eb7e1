"""Scaling: training throughput against workers and nodes, beside the model's projection.

Every measured point is an ordinary training run (``python -m reproduce train``, tagged
``results.sweep_id``) of a fixed number of steps, no target: 2 epochs of ``steps`` steps,
the throughput taken from the second epoch's curve row (samples / training seconds of
that epoch: start-up and the first steps' warm-up excluded).  Weak scaling, as in the
performance model: the global batch is ``batch_per_worker x world size``.

``efficiency`` = throughput at N workers / (N x throughput of the 1 x 1 run).  One worker
communicates nothing, so the 1 x 1 run (dense) is the reference of every method; HiTopKComm
needs 2 nodes, so it has no 1-node points.  Projected rows come from the performance
model's public ``project`` (the paper's 16 x 8 V100 at 25 Gbit/s and fewer nodes); the
model gives efficiency, not samples/s, so their throughput is empty.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from bench.cluster import perfmodel, projection
from bench.registry import ConfigError
from bench.results.records import read_curve
from bench.sweeps.common import check_names, options, sweep_records, validate_jobs
from bench.sweeps.resume import RERUN_FAILED, Saved, latest, pending

COLUMNS = [
    "sweep_id",
    "cluster",
    "comm",
    "nnodes",
    "nproc_per_node",
    "world_size",
    "throughput_samples_per_s",
    "efficiency",
    "kind",
    "run_id",
]
# the columns of the table the report shows (bench.report.report)
REPORT_COLUMNS = [
    "cluster",
    "comm",
    "nnodes",
    "world_size",
    "throughput_samples_per_s",
    "efficiency",
    "kind",
    "run_id",
]
PAPER = {"gbps": 25.0, "nodes": (1, 2, 4, 8, 16), "procs_per_node": 8}
NEEDS_NODES = {"hitopk": 2}  # methods refused below this many nodes


class ModelChanged(RuntimeError):
    """The performance model's public interface is not what this module calls."""


def parse_topologies(text: str) -> list[tuple[int, int]]:
    """``"1x1,1x2,2x2"`` -> ``[(1, 1), (1, 2), (2, 2)]`` (nodes x workers per node)."""
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            n, m = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise ConfigError(f"topology {item!r} is not NODESxWORKERS, e.g. 2x2") from None
        if n < 1 or m < 1:
            raise ConfigError(f"topology {item!r}: nodes and workers must be >= 1")
        out.append((n, m))
    if not out:
        raise ConfigError("no topology given (e.g. --topologies 1x1,1x2,2x2)")
    return out


@dataclass
class Plan(Saved):
    """One scaling sweep, saved at ``<results>/scaling/<sweep_id>.plan.json``."""

    FOLDER, WHAT = "scaling", "scaling"
    sweep_id: str
    experiment: str = "dawnbench_digits"
    cluster: str = "local"
    comms: Sequence[str] = ("dense", "hitopk")
    topologies: Sequence[tuple[int, int]] = ((1, 1), (1, 2), (2, 1), (2, 2))
    steps: int = 5
    batch_per_worker: int = 64
    results_dir: str = "results"
    extra: Sequence[str] = ()
    launcher: str = ""  # "" = one run after the other here, else a Hydra launcher
    launcher_overrides: Sequence[str] = ()

    def check(self) -> None:
        """Names, sizes and every job's config, before anything runs."""
        check_names("experiment", [self.experiment], options("experiment"))
        check_names("cluster", [self.cluster], options("cluster"))
        check_names("comm", list(self.comms), options("comm"))
        if self.steps < 1 or self.batch_per_worker < 1:
            raise ConfigError("--steps and --batch-per-worker must be >= 1")
        if (1, 1) not in self.topologies:
            raise ConfigError("the topologies must include 1x1, the reference of efficiency")
        validate_jobs([job for _, job in self.jobs()], self.results_dir)

    def points(self) -> list[tuple[str, int, int]]:
        """(comm, nodes, workers per node) of each run: 1 x 1 once (dense), each method
        where it runs."""
        pts = [("dense", 1, 1)]
        for comm, (n, m) in itertools.product(self.comms, self.topologies):
            if (n, m) != (1, 1) and n >= NEEDS_NODES.get(comm, 1):
                pts.append((comm, n, m))
        return pts

    def skipped(self) -> list[str]:
        return [
            f"{comm} on {n}x{m}: needs >= {NEEDS_NODES[comm]} nodes"
            for comm, (n, m) in itertools.product(self.comms, self.topologies)
            if n < NEEDS_NODES.get(comm, 1) and (n, m) != (1, 1)
        ]

    def jobs(self) -> list[tuple[tuple[str, int, int], list[str]]]:
        out = []
        for comm, n, m in self.points():
            out.append(
                (
                    (comm, n, m),
                    [
                        f"experiment={self.experiment}",
                        f"cluster={self.cluster}",
                        f"cluster.nnodes={n}",
                        f"cluster.nproc_per_node={m}",
                        f"comm={comm}",
                        f"data.batch_size={self.batch_per_worker * n * m}",
                        "train.epochs=2",
                        f"train.max_steps_per_epoch={self.steps}",
                        "train.stop_at_target=false",
                        "train.checkpoint_every=0",
                        "train.progress=false",
                        "results.plot=false",
                        f"results.dir={self.results_dir}",
                        f"results.sweep_id={self.sweep_id}",
                        *self.extra,
                    ],
                )
            )
        return out

    def pending(self) -> list[int]:
        """Indices of the runs without a finished record: a failed run measured nothing,
        so it is run again too (``RERUN_FAILED``)."""
        keys = [p for p, _ in self.jobs()]
        recs = sweep_records(self.results_dir, self.sweep_id)
        return pending(keys, recs, key_of, RERUN_FAILED)

    def run(self, sweep_dir: str | Path, runner: Callable[..., list[int]]) -> list[int]:
        """The runs not yet done, through ``runner(jobs, sweep_dir, experiment)``
        (``common.run_each``: one after the other here; or a Hydra launcher)."""
        jobs = self.jobs()
        todo = [jobs[i][1] for i in self.pending()]
        return runner(todo, sweep_dir, self.experiment)


def key_of(rec: dict[str, Any]) -> tuple[str, int, int] | None:
    """A scaling run's key: (comm, nodes, workers per node)."""
    cl = (rec.get("config") or {}).get("cluster") or {}
    n, m = int(cl.get("nnodes", rec.get("nnodes", 1))), int(cl.get("nproc_per_node", 1))
    return (str(rec.get("comm")), n, m)


def run_throughput(rec: dict[str, Any]) -> float:
    """Samples/s of the run's last epoch (its curve), else the record's whole-run figure."""

    curve = rec.get("curve")
    if curve and Path(curve).is_file():
        df = read_curve(curve)
        if len(df) and {"data/samples", "clock/epoch_s"} <= set(df.columns):
            last = df.iloc[-1]
            if last["clock/epoch_s"] > 0:
                return float(last["data/samples"] / last["clock/epoch_s"])
    v = rec.get("throughput_samples_per_s")
    return float(v) if v else math.nan


def measured(records: Sequence[dict[str, Any]], sweep_id: str) -> pd.DataFrame:
    """One row per run that finished (an error run has no throughput: left out, counted
    by the caller); efficiency against the sweep's 1 x 1 run."""
    rows = []
    for r in latest(records, key_of, RERUN_FAILED).values():
        if r.get("status") not in ("ok", "target_missed"):
            continue
        cl = (r.get("config") or {}).get("cluster") or {}
        n, m = int(cl.get("nnodes", r.get("nnodes", 1))), int(cl.get("nproc_per_node", 1))
        rows.append(
            {
                "sweep_id": sweep_id,
                "cluster": cl.get("name", ""),
                "comm": r.get("comm"),
                "nnodes": n,
                "nproc_per_node": m,
                "world_size": n * m,
                "throughput_samples_per_s": run_throughput(r),
                "kind": "measured",
                "run_id": r.get("run_id"),
            }
        )
    df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "efficiency"])
    single = df[df["world_size"] == 1]["throughput_samples_per_s"]
    ref = single.mean() if len(single) else math.nan
    df["efficiency"] = df["throughput_samples_per_s"] / (df["world_size"] * ref)
    return df[COLUMNS]


def _project_fn() -> Callable[..., Any]:

    fn = getattr(perfmodel, "project", None)
    if fn is None:  # the projection to the paper's cluster may live in its own module
        try:
            fn = getattr(projection, "project", None)
        except ImportError:
            fn = None
    if fn is None:
        raise ModelChanged("bench.cluster.perfmodel has no public project(); no projection")
    return fn


def projected(comms: Sequence[str], sweep_id: str) -> pd.DataFrame:
    """The model's scaling efficiency of ``comms`` on the paper's cluster (ModelChanged,
    naming what differs, when its interface is not the one called here)."""
    fn = _project_fn()
    params = inspect.signature(fn).parameters
    known = {"gbps": (PAPER["gbps"],), "nodes": PAPER["nodes"]}
    if "procs_per_node" in params:
        known["procs_per_node"] = PAPER["procs_per_node"]
    if "comms" in params:
        known["comms"] = tuple(c for c in comms if c in perfmodel.KNOWN)
    if "hidden" in params:
        known["hidden"] = {}  # nothing measured on V100s: the projection's assumed share
    missing = [p.name for p in params.values() if p.default is p.empty and p.name not in known]
    if missing or not {"gbps", "nodes"} <= set(params):
        raise ModelChanged(
            f"the performance model's project{inspect.signature(fn)} is not the one this "
            f"sweep calls (needs gbps, nodes; cannot fill {missing}); no projection"
        )
    rows = fn(**{k: v for k, v in known.items() if k in params})
    out = []
    for r in rows:
        try:
            n, m, comm, eff = r["nodes"], r["procs_per_node"], r["comm"], r["efficiency"]
            g = r["gbps"]
        except (KeyError, TypeError) as e:
            raise ModelChanged(f"the model's project() rows lack {e}; no projection") from None
        if comm in comms and float(g) == PAPER["gbps"]:
            out.append(
                {
                    "sweep_id": sweep_id,
                    "cluster": f"model: {n}x{m} V100, {g:g} Gbit/s",
                    "comm": comm,
                    "nnodes": n,
                    "nproc_per_node": m,
                    "world_size": n * m,
                    "throughput_samples_per_s": math.nan,
                    "efficiency": float(eff),
                    "kind": "projected",
                    "run_id": "",
                }
            )
    return pd.DataFrame(out, columns=COLUMNS)


def format_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "(no rows)"
    show = df[["kind", "comm", "nnodes", "nproc_per_node", "throughput_samples_per_s"]].copy()
    show["throughput_samples_per_s"] = show["throughput_samples_per_s"].round(1)
    show["efficiency"] = df["efficiency"].round(3)
    return show.to_string(index=False)
