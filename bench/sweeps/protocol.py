"""The tuning protocol: the same tuning budget for every method, then fresh seeds.

Modelled on AlgoPerf's external-tuning ruleset (a search space per submission, a fixed
number of trials, the configuration chosen by a rule fixed before any run, then scored
on independent repetitions):

1. **Search spaces** (:data:`SPACES`, :data:`WORKLOAD_SPACES`): PowerSGD rank {4, 8} x
   start {step 2, after one dense epoch}; topk, mstopk, hitopk, randomk density schedule
   {none, warm-up} x final density {0.01, 0.001}; dense, fp16, bf16 nothing (one trial).
   Every tunable method has the same number of trials (4).
2. **Tuning.** Every trial of every tunable method trains on each of :data:`TUNE_SEEDS`,
   which are never evaluation seeds.  A one-trial method runs no tuning: its only
   configuration is carried forward.
3. **Selection rule, fixed in advance** (:func:`select`): per method the trial with the
   lowest *median* time to target over the tuning seeds, a run that missed the target
   counted at the budget ``B`` (:func:`bench.sweeps.intervals.budget_s`); ties go to the
   trial declared first.  Every trial's median, its runs and the choice are written to
   ``<results>/ablation/<sweep_id>-tuning.csv``.
4. **Evaluation.** Each method's selected configuration trains on each of
   :data:`EVAL_SEEDS` (5 by default); the table (:mod:`bench.sweeps.protocol_table`) is
   built from these runs alone.

Runs go seed-major (every configuration of one seed before the next seed), the order of
the configurations within a seed shuffled by ``order_seed`` (recorded in the plan), so
that load drift on a shared machine cannot align with a method.  Every run evaluates
every :data:`EVAL_EVERY_STEPS` optimizer steps (``train.eval_every_steps``; evaluation
is not training time), so time to target is resolved to a few steps, not to an epoch.
Every run's record carries ``protocol`` = {name, role, trial, selected}.

The plan is written to ``<results>/ablation/<sweep_id>.plan.json`` before the first run;
:func:`pending` compares it with the sweep's records, so an interrupted sweep resumes
(``python -m reproduce ablation --resume SWEEP_ID``) without redoing any recorded run.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench.comm import HOOKS
from bench.config import hydra_value
from bench.registry import ConfigError
from bench.sweeps.common import check_names, options, sweep_records, validate_jobs
from bench.sweeps.intervals import budget_s, censored_time
from bench.sweeps.resume import RERUN, Saved, latest, progress

NAME = "equal-budget-v1"  # the protocol's name in every record; change it with the rules
COMMS = ("dense", "fp16", "powersgd", "topk", "mstopk", "hitopk")
PAPER_METHODS = ("hitopk", "mstopk")  # the paper's; every other method is a peer
TUNE_SEEDS = (1000, 1001)  # tuning only: never an evaluation seed
EVAL_SEEDS = (0, 1, 2, 3, 4)
# optimizer steps between evaluations, per workload.  Digits on 2 workers takes 11 steps
# per epoch, so 2 steps resolve time to target to 0.18 epoch (about 0.6 s of training
# here) for one evaluation of the 360 held-out images (0.3-0.5 s, not training time);
# every step would double a run's wall time.  The Transformer takes 154 steps per epoch
# and one greedy-decoding evaluation costs about 5 s (about 10 steps): every 20 steps
# is 0.13 epoch, for 40 % more wall time per epoch.  transformer_protocol (the protocol's
# Transformer, 512 tokens per worker) takes about 300 steps per epoch and reaches the
# target in about 240: 20 steps are 8 % of dense's steps to target, for about 2.5 s of
# evaluation each.
EVAL_EVERY_STEPS = {"classification": 2, "translation": 20}
# the workloads the protocol runs on: --workload NAME -> experiment; python -m reproduce
# ablation with neither --workload nor --experiment runs each, one sweep after the other
WORKLOADS = {"image": "dawnbench_digits", "translation": "transformer_protocol"}
TRANSLATION = ("transformer_protocol", "transformer_embedded")  # the translation experiments
# what a workload's protocol sweep runs unless the command says otherwise.  Translation,
# sized to fit beside the image sweep in 120 minutes on 2 cores: the local cluster at 2 x 2
# (no shaped link: the answer on the paper's link and at the other ratios comes from the
# composition of its steps with the model's time per step, bench/sweeps/ratios.py), one
# tuning seed, and the methods the question names (dense, the peers fp16 and PowerSGD,
# the paper's mstopk and hitopk; the exact flat topk is the image sweep's reference).
WORKLOAD_DEFAULTS: dict[str, dict[str, Any]] = {
    "image": {"cluster": "emulated"},
    "translation": {
        "cluster": "local",
        "comms": ("dense", "fp16", "powersgd", "mstopk", "hitopk"),
        "tune_seeds": (1000,),
        "local_topology": (2, 2),
    },
}
QUICK = {"comms": ("dense", "hitopk"), "tune_seeds": (1000,), "eval_seeds": (0,), "trials": 2}
TUNE, EVAL = "tune", "eval"

Space = tuple[tuple[str, dict[str, Any]], ...]  # (trial label, CommConfig field values)
DEFAULT_SPACE: Space = (("default", {}),)  # nothing to tune (dense, fp16, bf16, ...)
# the sparse methods' warm-up schedule: per-epoch densities after which the final density
# repeats (the schedule the committed sweeps used, ending at the trial's final density)
WARMUP_SCHEDULE = (0.1, 0.05, 0.03)
SPARSE = ("topk", "mstopk", "randomk", "hitopk")


def _sparse_space(densities: tuple[float, ...] = (0.01, 0.001)) -> Space:
    """density schedule {none, warm-up} x final density ``densities``: 4 trials.  The
    warm-up sends the schedule's densities above the final one, then the final one."""
    out = []
    for d in densities:
        warm = [*(x for x in WARMUP_SCHEDULE if x > d), d]
        out.append((f"d{d:g}", {"density": d, "density_schedule": []}))
        out.append((f"d{d:g}-warmup", {"density": d, "density_schedule": warm}))
    return tuple(out)


# PowerSGD: rank {4, 8} x start {step 2, after one dense epoch}.  One epoch is the "about
# 10 % of the steps to target" of torch's guidance on the embedded tasks (6-8 epochs to
# target on digits, 12-16 % of them); warmup_epochs x steps per epoch is its start step.
_POWERSGD_SPACE = tuple(
    (f"rank{r}-start{'1ep' if w else '2'}", {"powersgd_rank": r, "warmup_epochs": w})
    for r in (4, 8)
    for w in (0, 1)
)
#: comm -> its trials; a method not named has one (:data:`DEFAULT_SPACE`)
SPACES: dict[str, Space] = {**{c: _sparse_space() for c in SPARSE}, "powersgd": _POWERSGD_SPACE}
#: workload -> comm -> its trials where the default's do not fit (as many): the embedded
#: Transformer (AdamW) barely learns at density 0.01 and learns at 0.05 (docs/protocol.md)
WORKLOAD_SPACES = {"translation": {c: _sparse_space((0.05, 0.01)) for c in SPARSE}}


def local_topology(workload: str) -> list[str]:
    """The local cluster's topology overrides for ``workload`` (classification or
    translation, :meth:`Plan.workload`): by default 2 launcher agents of one worker each
    (hitopk needs 2 nodes; every method trains on the same topology)."""
    name = "translation" if workload == "translation" else "image"
    n, m = WORKLOAD_DEFAULTS[name].get("local_topology", (2, 1))
    return [f"cluster.nnodes={n}", f"cluster.nproc_per_node={m}"]


def space(comm: str, trials: int | None = None, workload: str = "classification") -> Space:
    """The search space of ``comm`` on ``workload``: (trial label, CommConfig field
    values), in declared order; ``trials`` keeps the first that many (the quick protocol)."""
    HOOKS.get(comm)  # an unknown name fails here, listing the known ones
    s = WORKLOAD_SPACES.get(workload, {}).get(comm) or SPACES.get(comm, DEFAULT_SPACE)
    return s[:trials] if trials else s


def _value(v: Any) -> str:
    """A Hydra override value: lists as ``[a,b]``, floats in their shortest form."""
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


@dataclass(frozen=True)
class Job:
    """One protocol run: its role, method, trial and seed (the key :func:`pending` uses)."""

    role: str
    comm: str
    trial: str
    seed: int

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.role, self.comm, self.trial, self.seed)


@dataclass
class Plan(Saved):
    """One protocol sweep; :meth:`save` writes it (``<results>/ablation/<sweep_id>.plan.json``),
    :meth:`load` reads it back to resume."""

    FOLDER, WHAT = "ablation", "protocol"

    sweep_id: str
    experiment: str = "dawnbench_digits"
    cluster: str = "emulated"
    comms: Sequence[str] = COMMS
    tune_seeds: Sequence[int] = TUNE_SEEDS
    eval_seeds: Sequence[int] = EVAL_SEEDS
    trials: int | None = None  # None: every trial of each space (QUICK keeps 2)
    order_seed: int = 0  # shuffles the configurations within each seed
    eval_every_steps: int = 0  # 0: the workload's EVAL_EVERY_STEPS
    results_dir: str = "results"
    cluster_overrides: Sequence[str] = ()
    extra: Sequence[str] = ()  # further Hydra overrides, applied to every job
    name: str = NAME
    # how the jobs are submitted (not what they are): "" = the local run queue, else a
    # Hydra launcher (bench.launch.submit) and its hydra.* overrides
    launcher: str = ""
    launcher_overrides: Sequence[str] = ()
    notes: list[str] = field(default_factory=list)

    # -- checks -------------------------------------------------------------------------
    def check(self) -> None:
        """Names known, seeds disjoint and enough of them (ConfigError otherwise)."""
        check_names("experiment", [self.experiment], options("experiment"))
        check_names("cluster", [self.cluster], options("cluster"))
        # every training method (a measurement device such as nocomm trains nothing)
        known = [*COMMS, *(c for c in HOOKS if c not in COMMS and not HOOKS.get(c).measurement)]
        check_names("comm", list(self.comms), [c for c in known if c in options("comm")])
        if not self.eval_seeds or not self.tune_seeds:
            raise ConfigError("the protocol needs tuning seeds and evaluation seeds")
        shared = set(self.tune_seeds) & set(self.eval_seeds)
        if shared:
            raise ConfigError(f"tuning and evaluation seeds overlap: {sorted(shared)}")
        if len(set(self.eval_seeds)) != len(self.eval_seeds):
            raise ConfigError(f"evaluation seeds repeat: {list(self.eval_seeds)}")
        sizes = {c: len(self._space(c)) for c in self.comms}
        tuned = {n for n in sizes.values() if n > 1}
        if len(tuned) > 1:  # every tunable method gets the same budget of trials
            raise ConfigError(f"unequal numbers of trials: {sizes}")

    def check_jobs(self) -> None:
        """Every (method, trial) composes and passes the run's own checks."""
        jobs = [self.overrides(Job(TUNE, c, t, 0)) for c in self.comms for t, _ in self._space(c)]
        validate_jobs(jobs, self.results_dir)

    # -- jobs ---------------------------------------------------------------------------
    def _space(self, comm: str) -> Space:
        return space(comm, self.trials, self.workload())

    def workload(self) -> str:
        return "translation" if self.experiment in TRANSLATION else "classification"

    def every(self) -> int:
        return self.eval_every_steps or EVAL_EVERY_STEPS[self.workload()]

    def _order(self, items: list[Any], phase: str, seed: int) -> list[Any]:
        """``items`` shuffled by (order_seed, phase, seed): a recorded, reproducible order."""
        out = list(items)
        random.Random(f"{self.order_seed}/{phase}/{seed}").shuffle(out)
        return out

    def tune_jobs(self) -> list[Job]:
        """Seed-major: every trial of every tunable method on one tuning seed, shuffled."""
        trials = [(c, t) for c in self.comms if len(self._space(c)) > 1 for t, _ in self._space(c)]
        return [
            Job(TUNE, c, t, s) for s in self.tune_seeds for c, t in self._order(trials, TUNE, s)
        ]

    def eval_jobs(self, selected: Mapping[str, str]) -> list[Job]:
        """Seed-major: each method's selected trial on one evaluation seed, shuffled."""
        return [
            Job(EVAL, c, selected[c], s)
            for s in self.eval_seeds
            for c in self._order(list(self.comms), EVAL, s)
        ]

    def common_overrides(self) -> list[str]:
        topo = local_topology(self.workload()) if self.cluster == "local" else []
        return [
            f"experiment={self.experiment}",
            f"cluster={self.cluster}",
            *topo,
            *self.cluster_overrides,
            f"results.dir={hydra_value(self.results_dir)}",
            f"results.sweep_id={self.sweep_id}",
            "train.progress=false",
            f"train.eval_every_steps={self.every()}",
            *self.extra,
        ]

    def overrides(self, job: Job) -> list[str]:
        """The Hydra overrides of one job: the trial's comm fields, seed and protocol tags."""
        values = dict(self._space(job.comm))[job.trial]
        return [
            *self.common_overrides(),
            f"comm={job.comm}",
            *(f"comm.{k}={_value(v)}" for k, v in values.items()),
            f"train.seed={job.seed}",
            f"results.protocol={self.name}",
            f"results.protocol_role={job.role}",
            f"results.protocol_trial={job.trial}",
            f"results.protocol_selected={_value(job.role == EVAL)}",
        ]


# the fields chosen when a sweep starts (a rerun of its command does not choose them again)
START_FIELDS = ("order_seed", "cluster_overrides")


# -- records --------------------------------------------------------------------------------


def job_of(rec: Mapping[str, Any]) -> Job | None:
    """The job a record ran, from its ``protocol`` field and seed; None if not a protocol run."""
    p = rec.get("protocol") or {}
    if not p.get("role"):
        return None
    seed = ((rec.get("config") or {}).get("train") or {}).get("seed")
    return Job(str(p["role"]), str(rec.get("comm")), str(p.get("trial")), int(seed or 0))


def _key(rec: Mapping[str, Any]) -> tuple[str, str, str, int] | None:
    j = job_of(rec)
    return j.key if j is not None else None


def recorded(
    records: Sequence[Mapping[str, Any]], rerun: Sequence[str] = RERUN
) -> dict[tuple[str, str, str, int], dict]:
    """Job key -> its latest record; a run whose latest record is ``interrupted`` (or in
    ``rerun``) is not recorded (it is run again)."""
    return latest(records, _key, rerun)  # type: ignore[return-value]


def pending(
    jobs: Sequence[Job], records: Sequence[Mapping[str, Any]], rerun: Sequence[str] = RERUN
) -> list[Job]:
    """The jobs without a record, in their order: what a resumed sweep still runs."""
    done = recorded(records, rerun)
    return [j for j in jobs if j.key not in done]


def status(plan: Plan, records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where the sweep stands, one line per stage (``--status``, ``--aggregate``)."""
    tune = plan.tune_jobs()
    lines = [progress("tuning", [j.key for j in tune], records, _key)] if tune else []
    if not tuning_complete(plan, records):
        n = len(plan.comms) * len(plan.eval_seeds)
        return [*lines, f"evaluation: 0 of {n} recorded, submitted once tuning is recorded"]
    ev = plan.eval_jobs(select(tuning_table(plan, records)))
    return [*lines, progress("evaluation", [j.key for j in ev], records, _key)]


def complete(plan: Plan, records: Sequence[Mapping[str, Any]]) -> bool:
    """Every tuning and evaluation job recorded."""
    if not tuning_complete(plan, records):
        return False
    return not pending(plan.eval_jobs(select(tuning_table(plan, records))), records)


def tuning_table(plan: Plan, records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (method, trial): its tuning runs, their median time to target with
    misses at the budget, and whether the rule selects it (:func:`select`)."""
    runs = [r for r in recorded(records).values() if (r.get("protocol") or {}).get("role") == TUNE]
    budget = budget_s(runs)
    rows = []
    for comm in plan.comms:
        trials = plan._space(comm)
        for order, (trial, values) in enumerate(trials):
            mine = [r for r in runs if r.get("comm") == comm and r["protocol"]["trial"] == trial]
            times = [censored_time(r, budget) for r in mine]
            rows.append(
                {
                    "sweep_id": plan.sweep_id,
                    "protocol": plan.name,
                    "comm": comm,
                    "trial": trial,
                    "order": order,
                    "overrides": " ".join(f"comm.{k}={_value(v)}" for k, v in values.items()),
                    "n_runs": len(mine),
                    "n_reached": sum(r.get("time_to_target_s") is not None for r in mine),
                    "median_time_s": statistics.median(times) if times else math.nan,
                    "budget_s": budget,
                    "seeds": " ".join(str(job_of(r).seed) for r in mine),  # type: ignore[union-attr]
                    "run_ids": " ".join(str(r["run_id"]) for r in mine),
                    "tuned": len(trials) > 1,
                }
            )
    df = pd.DataFrame(rows)
    df["selected"] = False
    for comm, trial in select(df).items():
        df.loc[(df["comm"] == comm) & (df["trial"] == trial), "selected"] = True
    return df


def select(tuning: pd.DataFrame) -> dict[str, str]:
    """The rule, fixed in advance: per method, the trial of lowest median time to target
    (misses at the budget); ties, and a method without tuning runs, go to the trial
    declared first."""
    out = {}
    for comm, g in tuning.groupby("comm", sort=False):
        g = g.sort_values("order", kind="stable")
        med = g["median_time_s"].fillna(math.inf)
        out[str(comm)] = (
            str(g.loc[med.idxmin(), "trial"]) if med.notna().any() else str(g["trial"].iloc[0])
        )
    return out


def tuning_complete(plan: Plan, records: Sequence[Mapping[str, Any]]) -> bool:
    return not pending(plan.tune_jobs(), records)


def run(
    plan: Plan,
    runner: Callable[[list[list[str]], Path, str], list[int]],
    sweep_dir: str | Path,
    write: Callable[[pd.DataFrame, Path], bool],
    log: Callable[[str], None] = print,
    rerun: Sequence[str] = RERUN,
) -> list[int]:
    """Tune, select, evaluate; the jobs already recorded are skipped (``rerun``: the
    statuses run again).  ``runner`` is ``common.run_queued`` (one launch of the workers
    per phase) or a Hydra launcher's submission (``bench.launch.submit``), ``write`` the
    never-replacing ``common.write_table``.  Returns the exit statuses of the jobs run."""
    sweep_dir = Path(sweep_dir)
    rcs: list[int] = []
    recs = sweep_records(plan.results_dir, plan.sweep_id)
    todo = pending(plan.tune_jobs(), recs, rerun)
    if todo:
        log(f"tuning: {len(todo)} of {len(plan.tune_jobs())} runs to go")
        rcs += runner([plan.overrides(j) for j in todo], sweep_dir / TUNE, plan.experiment)
        recs = sweep_records(plan.results_dir, plan.sweep_id)
    left = pending(plan.tune_jobs(), recs)
    if left:
        raise ConfigError(
            f"{len(left)} tuning run(s) left no record, so no evaluation was submitted; "
            f"run the same command again (or --resume {plan.sweep_id}) to submit them"
        )
    tuning = tuning_table(plan, recs)
    path = Path(plan.results_dir) / "ablation" / f"{plan.sweep_id}-tuning.csv"
    write(tuning, path)
    chosen = select(tuning)
    log("selected: " + ", ".join(f"{c} {t}" for c, t in chosen.items()) + f" ({path})")
    todo = pending(plan.eval_jobs(chosen), recs, rerun)
    if todo:
        log(f"evaluation: {len(todo)} of {len(plan.eval_jobs(chosen))} runs to go")
        rcs += runner([plan.overrides(j) for j in todo], sweep_dir / EVAL, plan.experiment)
    return rcs
