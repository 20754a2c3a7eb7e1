"""The protocol's measured clusters: an emulated 2 x 2 whose link is shaped (each round
``bandwidth x measured / target``, read back from the records) until dense's measured
comm / compute is a named ratio, the model's prediction of each written before its
evaluation, the measured table beside it, and one CPU kind for every measured run.
Rules: docs/protocol.md.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench import methods
from bench.launch import profile
from bench.registry import ConfigError
from bench.results import whole
from bench.results.env import cpu_model
from bench.sweeps import extension
from bench.sweeps import intervals as iv
from bench.sweeps import protocol as pr
from bench.sweeps.common import sweep_records, write_table
from bench.sweeps.resume import RERUN, RERUN_FAILED

SHAPE, MAX_ROUNDS = pr.SHAPE, pr.SHAPE_ROUNDS  # the role of a shaping run; rounds at most
TOLERANCE = 0.15  # the measured ratio within 15 % of its target
STEP_BOUND = 8.0  # one round changes the bandwidth by at most this factor either way
NODES, PROCS = 2, 2  # the emulated cluster's topology: the local cluster's (LOCAL_TOPOLOGY)
PREDICTION, MEASURED_TABLE = "prediction", "measured"  # the tables' file name suffixes
DENSE, NOCOMM = methods.names(group="baseline")[0], methods.names(kind="reference")[0]


def names(plan: pr.Plan) -> list[str]:
    return list(pr.measured_clusters(plan))


def shape_jobs(where: str, k: int) -> list[pr.Job]:
    """Round ``k`` of shaping ``where``: dense and the compute-only reference, interleaved."""
    return [pr.Job(SHAPE, c, f"round {k}", s, where) for s in pr.SHAPE_SEEDS
            for c in (DENSE, NOCOMM)]  # fmt: skip


def rate(bps: float) -> str:
    """A bandwidth in tc's spelling, to the kbit/s."""
    return f"{max(1, round(bps / 1e3))}kbit"


def _links(plan: pr.Plan) -> dict[tuple[str, int | None], str]:
    """(cluster, round or None: shaped) -> its link's rate (``Plan._link`` reads it)."""
    return plan.__dict__.setdefault("_links", {})


@dataclass
class Round:
    rate: str
    dense_s: float
    nocomm_s: float

    @property
    def ratio(self) -> float:
        return (self.dense_s - self.nocomm_s) / self.nocomm_s


@dataclass
class Shaping:
    name: str
    target: float
    rounds: list[Round] = field(default_factory=list)
    todo: list[pr.Job] = field(default_factory=list)  # the current round's runs to go
    errors: int = 0  # of the current round's runs, ended in error

    def within(self, r: Round) -> bool:
        return abs(r.ratio - self.target) <= TOLERANCE * self.target

    @property
    def shaped(self) -> Round | None:
        return self.rounds[-1] if self.rounds and self.within(self.rounds[-1]) else None

    @property
    def failed(self) -> bool:
        return self.shaped is None and len(self.rounds) >= MAX_ROUNDS

    def line(self) -> str:
        tried = ", ".join(f"{r.ratio:.2f} at {r.rate}" for r in self.rounds) or "no round yet"
        if self.shaped:
            s = self.shaped
            how = f"shaped: measured {s.ratio:.2f} at {s.rate} (compute {s.nocomm_s * 1e3:.1f} ms"
            return f"{self.name}: target {self.target:.2f}, {how} per step; rounds: {tried})"
        if self.failed:
            return (f"{self.name}: dense's measured comm / compute was {tried} in "
                    f"{len(self.rounds)} rounds, never within {TOLERANCE:.0%} of "
                    f"{self.target:.2f}")  # fmt: skip
        left = f", {len(self.todo)} runs to go" if self.todo else ""
        return f"{self.name}: target {self.target:.2f}, round {len(self.rounds)}{left}; {tried}"


def _rate_of(rec: Mapping[str, Any]) -> str:
    return str(((rec.get("config") or {}).get("cluster") or {}).get("inter_node_bandwidth"))


def shaping(
    plan: pr.Plan, records: Sequence[Mapping[str, Any]], rerun: Sequence[str] = RERUN
) -> dict[str, Shaping]:
    """Each measured cluster's shaping from the records; the links of the rounds to come
    and the shaped ones go to :func:`_links`."""
    from bench.cluster.netns import parse_bandwidth

    done = pr.recorded(records, rerun)
    out = {}
    for name, (_, target) in pr.measured_clusters(plan).items():
        sh = Shaping(name, target)
        out[name] = sh
        while sh.shaped is None and not sh.failed:
            jobs = shape_jobs(name, len(sh.rounds))
            recs = [done.get(j.key) for j in jobs]
            sh.todo = [j for j, r in zip(jobs, recs, strict=True) if r is None]
            sh.errors = sum(r is not None and pr.step_s(r) is None for r in recs)
            if sh.todo or sh.errors:
                break
            times = {c: [pr.step_s(r) for j, r in zip(jobs, recs) if j.comm == c]  # type: ignore[misc]
                     for c in (DENSE, NOCOMM)}  # fmt: skip
            dense = [r for j, r in zip(jobs, recs) if j.comm == DENSE]
            link = statistics.median(parse_bandwidth(_rate_of(r)) for r in dense)  # type: ignore[arg-type]
            sh.rounds.append(Round(rate(link), *(statistics.median(t) for t in times.values())))
            last = sh.rounds[-1]
            step = min(STEP_BOUND, max(1 / STEP_BOUND, last.ratio / target))
            _links(plan)[(name, len(sh.rounds))] = rate(link * step)
        if sh.shaped:
            _links(plan)[(name, None)] = sh.shaped.rate
    return out


def shape(
    plan: pr.Plan,
    runner: Callable[[list[list[str]], Path, str], list[int]],
    sweep_dir: Path,
    log: Callable[[str], None] = print,
    rerun: Sequence[str] = RERUN,
) -> list[int]:
    """Each round's missing runs until every cluster is shaped (ConfigError when one never
    is or a run failed); the exit statuses of the runs."""
    rcs: list[int] = []
    while True:
        state = shaping(plan, load(plan), rerun)
        todo = [j for sh in state.values() for j in sh.todo]
        if not todo:
            break
        claim(plan, todo)
        log(f"shaping: {len(todo)} runs ({'; '.join(sh.line() for sh in state.values())})")
        rcs += runner([plan.overrides(j) for j in todo], sweep_dir / SHAPE, plan.experiment)
    for sh in state.values():
        log(f"shaping {sh.line()}")
        if sh.errors:
            again = "" if RERUN_FAILED[-1] in rerun else " --rerun-failed"
            raise ConfigError(
                f"shaping {sh.name}: {sh.errors} run(s) of round {len(sh.rounds)} ended in "
                f"error; --resume {plan.sweep_id}{again} runs them"
            )
        if sh.failed:
            raise ConfigError(f"shaping {sh.line()}: nothing measured runs on it")
    return rcs


def pin(plan: pr.Plan) -> str:
    """Time this machine's compute per step once, for the first guess of every measured
    link; a line saying so ("" when nothing was timed)."""
    from bench.config import to_object
    from bench.sweeps.common import compose

    if not names(plan) or plan.link_compute_s:
        return ""
    p = profile.apply(to_object(compose(plan.overrides(shape_jobs(names(plan)[0], 0)[0]))))
    assert p is not None
    plan.link_compute_s = float(p["compute_s"])
    return "the measured clusters' first guess of their link: " + profile.describe(p)


def kind_of(rec: Mapping[str, Any]) -> str:
    """The CPU model of a record's ``hardware`` line ("" if unsaid)."""
    m = re.search(r"(?:^CPU |host )(.+) \(\d+ cores\)", str(rec.get("hardware") or ""))
    return m.group(1) if m else ""


def other_kind(plan: pr.Plan, rec: Mapping[str, Any]) -> bool:
    """Whether ``rec`` is a measured run on another CPU kind than the plan's."""
    job, kind = pr.job_of(rec), kind_of(rec)
    return bool(job and job.where and plan.cpu_kind and kind and kind != plan.cpu_kind)


def kept(plan: pr.Plan, records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """``records`` but the measured runs on another CPU kind than the plan's: what the
    measured columns, the shaping and the selection read."""
    return [r for r in records if not other_kind(plan, r)]


def kept_out(plan: pr.Plan, records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The evaluation runs on another CPU kind (``--keep-out``) whose job has no run on the
    plan's kind: each counts as its job's run where only its steps count (the projections)
    and is kept out of the measured columns; it is not run again."""
    done = pr.recorded(kept(plan, records))
    return [
        r for r in records
        if other_kind(plan, r) and pr.job_of(r).role == pr.EVAL  # type: ignore[union-attr]
        and pr.job_of(r).key not in done  # type: ignore[union-attr]
    ]  # fmt: skip


def counted(plan: pr.Plan, records: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records the sweep goes on from and its tables read: :func:`kept`, then
    :func:`kept_out` (the latest record of their jobs)."""
    return [*kept(plan, records), *kept_out(plan, records)]


def load(plan: pr.Plan) -> list[Mapping[str, Any]]:
    return counted(plan, sweep_records(plan.results_dir, plan.sweep_id))


def claim(plan: pr.Plan, jobs: Sequence[pr.Job]) -> None:
    """With a measured run among ``jobs``, the plan's CPU kind is this machine's (the first
    one records it); ConfigError naming both otherwise."""
    if not any(j.where for j in jobs):
        return
    here = cpu_model()
    if plan.cpu_kind and plan.cpu_kind != here:
        raise ConfigError(
            f"sweep {plan.sweep_id}'s measured runs ran on {plan.cpu_kind}; this machine is "
            f"{here}: resume it on the kind it ran on (one CPU kind per sweep)"
        )
    if not plan.cpu_kind:
        plan.cpu_kind = here
        path = plan.path()
        if path.exists():  # the saved plan keeps it: a resumed sweep checks against it
            d = {**json.loads(path.read_text()), "cpu_kind": here}
            whole.write(path, json.dumps(d, indent=1, sort_keys=True) + "\n")


def status(plan: pr.Plan, records: Sequence[Mapping[str, Any]]) -> list[str]:
    """:func:`bench.sweeps.protocol.status` with the shaping lines after the tuning's."""
    mine = counted(plan, records)
    lines = pr.status(plan, mine)
    shaping_ = [f"shaping {sh.line()}" for sh in shaping(plan, mine).values()]
    out = sum(other_kind(plan, r) for r in records)
    if plan.cpu_kind or out:
        ev = len(kept_out(plan, records))  # their jobs done; the others' to be run again
        said = {f"{ev} evaluation run(s) on another kind kept out of the measured columns": ev,
                f"{out - ev} on another kind kept out, run again": out - ev}  # fmt: skip
        again = "; ".join(k for k, n in said.items() if n)
        again = f" ({again})" if again else ""
        shaping_.append(f"measured runs on {plan.cpu_kind or 'no CPU kind yet'}{again}")
    return [*lines[:1], *shaping_, *lines[1:]]


def run(
    plan: pr.Plan,
    runner: Callable[[list[list[str]], Path, str], list[int]],
    sweep_dir: str | Path,
    write: Callable[[pd.DataFrame, Path], bool],
    log: Callable[[str], None] = print,
    rerun: Sequence[str] = RERUN,
    until: str = "",
    keep_out: bool = False,
) -> list[int]:
    """Tune (``until="tuning"``: only that), shape, time, extend the rates at an edge,
    select, predict, evaluate, skipping the jobs recorded; the exit statuses of the runs.
    ``runner``: ``common.run_queued`` or a Hydra launcher's submission.  ``keep_out``: the
    evaluation runs left run here although the plan's CPU kind is another; they are
    :func:`kept_out` (every other run still needs the plan's kind)."""
    sweep_dir = Path(sweep_dir)
    rcs: list[int] = []

    def stage(name: str, jobs: list[pr.Job], role: str) -> None:
        nonlocal rcs
        todo = pr.pending(jobs, load(plan), rerun)
        if todo:
            where, here = "", cpu_model()
            if plan.measured and keep_out and role == pr.EVAL and plan.cpu_kind not in ("", here):
                where = (f" on {here}, kept out of the measured columns (the sweep's "
                         f"measured runs ran on {plan.cpu_kind})")  # fmt: skip
            elif plan.measured:
                claim(plan, todo)  # one CPU kind for every measured run
            log(f"{name}: {len(todo)} of {len(jobs)} runs to go{where}")
            rcs += runner([plan.overrides(j) for j in todo], sweep_dir / role, plan.experiment)

    stage("tuning", plan.tune_jobs(), pr.TUNE)
    if until == "tuning":
        return rcs
    if plan.measured:  # the links, from the records (ConfigError: a cluster not shaped)
        rcs += shape(plan, runner, sweep_dir, log, rerun)
    stage("timing pass", plan.timing_jobs(), pr.TIME)
    recs = load(plan)
    for _ in range(extension.MAX_ROUNDS):  # each round decided by the records before it
        ext = pr.extend(plan, recs)
        todo = pr.pending(ext.jobs, recs, rerun)
        if not todo:
            break
        log(f"rate extension, round {ext.rounds}: {len(todo)} of {len(ext.jobs)} runs to go")
        rcs += runner([plan.overrides(j) for j in todo], sweep_dir / pr.TUNE, plan.experiment)
        recs = load(plan)
    ext = pr.extend(plan, recs)
    tuning = pr.selection_table(plan, recs, ext.trials)
    path = Path(plan.results_dir) / "ablation" / f"{plan.sweep_id}-tuning.csv"
    write(tuning, path)  # partial (``write`` decides) while runs are missing or failed
    if not ext.settled:  # a selection on missing data is no selection
        jobs = [*plan.tune_jobs(), *plan.timing_jobs(), *ext.jobs]
        left = pr.pending(jobs, recs, pr.RERUN_FAILED)
        failed = sum(j.key in pr.recorded(recs) for j in left)  # recorded, in error
        again = f"--resume {plan.sweep_id}" + (" --rerun-failed" if failed else "")
        raise ConfigError(
            f"{len(left)} of {len(jobs)} tuning, timing and rate-extension runs are missing "
            f"({failed} ended in error), so no configuration was selected and no evaluation "
            f"submitted; {again} runs them"
        )
    if ext.at_edge:
        log(f"note: {extension.bound_note(ext)} ({path})")
    picked = pr.select_per_cluster(tuning)
    log(f"selected: {picked} ({path})")
    if plan.measured:  # the model's word on each, before its runs: made once, never replaced
        if not keep_out:  # on the sweep's CPU kind
            claim(plan, pr.pending(plan.eval_jobs(picked), recs, rerun))
        pred = table_path(plan, PREDICTION)
        if not pred.exists():
            write_table(predictions(plan, recs, picked), pred)
        log(f"predicted: {pred}")
    stage("evaluation", plan.eval_jobs(picked), pr.EVAL)
    return rcs


def _model(experiment: str, bps: float, compute_s: float, cpu: str = "cpu") -> tuple[Any, Any, Any]:
    """(workload, cluster, costs) of an emulated 2 x 2 at ``bps`` whose step computes in
    ``compute_s``: the experiment's own network, the costs measured on ``cpu`` (a CPU model
    with calibration rows; "cpu": this machine's)."""
    from bench.cluster import calibration
    from bench.cluster import perfmodel as pm

    cluster = pm.emulated(bps, NODES, PROCS, compute_s, loopback=calibration.loopback(cpu))
    return pm.workload_shapes(experiment), cluster, calibration.costs(cpu)


def predictions(
    plan: pr.Plan, records: Sequence[Mapping[str, Any]], picked: Mapping[str, Mapping[str, str]]
) -> pd.DataFrame:
    """Per measured cluster and method, the selected configuration's predicted time to
    target: the median over its tuning runs of each phase's steps x the model's step time."""
    from bench.cluster.netns import parse_bandwidth

    state = shaping(plan, records)
    tuned = [r for r in pr.recorded(records).values() if pr.job_of(r).role == pr.TUNE]  # type: ignore[union-attr]
    rows = []
    for name, (prof, target) in pr.measured_clusters(plan).items():
        shaped = state[name].shaped
        if shaped is None:
            raise ConfigError(f"{name} is not shaped: no prediction is made for it")
        bps = parse_bandwidth(shaped.rate)
        wl, cluster, costs = _model(plan.experiment, bps, shaped.nocomm_s, plan.cpu_kind or "cpu")
        for comm, trial in picked.get(name, {}).items():
            times: list[float] = []
            for r in tuned:
                if (pr.job_of(r).comm, r["protocol"]["trial"]) != (comm, trial):  # type: ignore[union-attr]
                    continue
                if (run := pr.run_of(plan, r)) is None:
                    continue
                sent = pr.phase_sends(run, r)
                model = {
                    (m, k): methods.get(m).step_time(wl, cluster, costs, k) for _, m, k in sent
                }
                times.append(pr.cluster_time(run, sent, None, model))
            rows.append({
                "sweep_id": plan.sweep_id, "experiment": plan.experiment, "cluster": name,
                "profile": prof, "target_ratio": target, "measured_ratio": shaped.ratio,
                "bandwidth_bps": bps, "compute_s": shaped.nocomm_s, "cpu_kind": plan.cpu_kind,
                "comm": comm, "trial": trial, "n_tuning_runs": len(times),
                "predicted_s": statistics.median(times) if times else math.nan,
            })  # fmt: skip
    return pd.DataFrame(rows)


def table_path(plan: pr.Plan, what: str) -> Path:
    return Path(plan.results_dir) / "ablation" / f"{plan.sweep_id}-{what}.csv"


def table(plan: pr.Plan, records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The prediction table with the measured median time to target (a miss counts at the
    budget, 95 % bootstrap interval) and the prediction's error; empty before it is written."""
    path = table_path(plan, PREDICTION)
    if not path.exists():
        return pd.DataFrame()
    mine = kept(plan, records)
    done = [(pr.job_of(r), r) for r in pr.recorded(mine).values()]
    ids = {id(r) for r in mine}
    other = [pr.job_of(r) for r in records if id(r) not in ids]  # another CPU kind
    budget = iv.budget_s([r for j, r in done if j.role in (pr.TUNE, pr.EVAL)])  # type: ignore[union-attr]
    rows = []
    for row in pd.read_csv(path).to_dict("records"):
        key = (pr.EVAL, row["cluster"], row["comm"], row["trial"])
        runs = sorted((j.seed, r) for j, r in done if (j.role, j.where, j.comm, j.trial) == key)  # type: ignore[union-attr]
        good = [(s, r) for s, r in runs if r.get("status") in ("ok", "target_missed")]
        m, lo, hi = iv.mean_interval([iv.censored_time(r, budget) for _, r in good], np.median)
        rows.append({
            **row, "measured_median_s": m, "measured_ci_low_s": lo, "measured_ci_high_s": hi,
            "prediction_error": row["predicted_s"] / m - 1 if m else math.nan,
            "n_runs": len(runs), "n_reached": sum(r.get("time_to_target_s") is not None
                                                  for _, r in runs),
            "n_error": len(runs) - len(good),
            "n_other_kind": sum((j.role, j.where, j.comm, j.trial) == key for j in other),  # type: ignore[union-attr]
            "seeds": " ".join(str(s) for s, _ in good),
            "run_ids": " ".join(str(r["run_id"]) for _, r in runs),
        })  # fmt: skip
    return pd.DataFrame(rows)


def format_table(df: pd.DataFrame) -> str:
    if df.empty:
        return "(no prediction yet: the measured clusters' table comes with the evaluation)"
    head = f"measured clusters (CPU {df['cpu_kind'].iloc[0]}): the model's prediction and the runs"
    show = pd.DataFrame({
        "cluster": df["cluster"],
        "ratio target / measured": [f"{a:.2f} / {b:.2f}" for a, b in
                                    zip(df["target_ratio"], df["measured_ratio"])],
        "link": [f"{b / 1e6:.2f} Mbit/s" for b in df["bandwidth_bps"]],
        "comm": df["comm"], "trial": df["trial"],
        "predicted_s": df["predicted_s"].round(1),
        "measured_s [95 %]": [iv.ci_text(m, lo, hi, 1, plain=True) for m, lo, hi in
                              zip(df["measured_median_s"], df["measured_ci_low_s"],
                                  df["measured_ci_high_s"])],
        "error": [f"{e:+.0%}" if e == e else "-" for e in df["prediction_error"]],
        "runs": df["n_runs"],
    })  # fmt: skip
    return head + "\n" + show.to_string(index=False)
