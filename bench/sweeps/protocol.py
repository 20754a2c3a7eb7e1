"""The tuning protocol (``equal-budget-v3``, after AlgoPerf's external tuning): the same
trials per method, tuning on :data:`TUNE_SEEDS`, a timing pass per measured cluster,
selection per cluster by a rule fixed in advance, then evaluation on fresh seeds; the plan
is saved before the first run and :func:`pending` resumes a sweep.  Rules: docs/protocol.md.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench import methods
from bench.launch.profile import PROFILES
from bench.methods import Knobs
from bench.registry import ConfigError
from bench.sweeps import extension
from bench.sweeps.common import (
    check_names,
    job_base,
    options,
    quick_methods,
    validate_jobs,
)
from bench.sweeps.resume import RERUN, RERUN_FAILED, Saved, latest, progress
from bench.sweeps.trials import (
    LR_FACTORS,
    TRIALS,
    Trial,
    beyond,
    check_distinct,
    check_placements,
    check_reached,
    draw,
    ran,
    sends,
)

NAME = "equal-budget-v3"  # the protocol's name in every record; change it with the rules
TUNE_SEEDS = (1000, 1001)  # tuning only: never an evaluation seed (both workloads)
EVAL_SEEDS = tuple(range(10))  # at least 10 per method and workload
MIN_EVAL_SEEDS = 10
# optimizer steps between evaluations, at most EVAL_SHARE of dense's steps to target
# (REF_STEPS): on digits 2 steps (3 % of 60) are 0.18 epoch for a 0.3-0.5 s evaluation; on
# transformer_protocol 12 steps (5 % of 240) for a 2.5 s greedy decoding (docs/protocol.md)
EVAL_EVERY_STEPS = {"classification": 2, "translation": 12}
EVAL_SHARE = 0.05
# a run's evaluation overhead under 30 % of its training: none before EVAL_FROM_SHARE of
# dense's steps to target (no committed run reached it in under 0.7), only every
# EVAL_STRIDE-th point evaluated, the models between kept (train.eval_stride)
EVAL_FROM_SHARE = 0.4
EVAL_STRIDE = {"classification": 3, "translation": 4}
# --workload NAME -> experiment; with neither --workload nor --experiment each runs in turn
WORKLOADS = {"image": "dawnbench_digits", "translation": "transformer_protocol"}
TRANSLATION = ("transformer_protocol", "transformer_embedded")  # the translation experiments
# steps to target are measured on the local cluster at the emulated cluster's 2 x 2 (the
# same gradients, so the same steps)
WORKLOAD_DEFAULTS: dict[str, dict[str, Any]] = {w: {"cluster": "local"} for w in WORKLOADS}
LOCAL_TOPOLOGY = ("cluster.nnodes=2", "cluster.nproc_per_node=2")  # every method alike
TUNE, EVAL, TIME, SHAPE = "tune", "eval", "time", "shape"
# the named profiles (bench.launch.profile) whose ratio an emulated 2 x 2 is shaped to and
# measured at (bench.sweeps.measured): the paper's 1.34 and the slow link's 5.37
MEASURED = ("paper", "paper-b64")


def quick() -> dict[str, Any]:
    """``--quick``, a smoke test and not the protocol."""
    return {
        "comms": quick_methods(),
        "tune_seeds": (1000,),
        "eval_seeds": (0,),
        "carry_seeds": 0,
        "trials": len(LR_FACTORS),
    }


Space = tuple[tuple[str, dict[str, Any]], ...]  # (trial label, Hydra overrides keyed in full)
# dense's optimizer steps to target on the tuning seeds of the committed sweeps (image 55-65,
# translation 220-260): the step axis of every schedule, fixed before the sweep
REF_STEPS = {"classification": 60, "translation": 240}
# the budget in optimizer steps (the recipe's epochs x steps per epoch at 2 x 2): trials that
# send alike up to it are one trial (Plan.check refuses them)
BUDGET_STEPS = {"classification": 132, "translation": 620}
#: the optimizer each workload's recipe trains with (the placements' fit is checked on it)
WORKLOAD_OPTIM = {"classification": "sgd", "translation": "adamw"}


def space(
    comm: str, recipe_lr: float, trials: int | None = None, workload: str = ""
) -> list[Trial]:
    """Method ``comm``'s trials at every rate of LR_FACTORS x its spec's centre (else x
    ``recipe_lr``); ``trials`` keeps the first that many."""
    spec = methods.get(comm)
    workload = workload or "classification"
    lr = spec.lr_centre.get(workload, recipe_lr)
    drawn = draw(spec.space(workload, REF_STEPS[workload]), lr)
    return drawn[:trials] if trials else drawn


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
    role: str
    comm: str
    trial: str
    seed: int
    where: str = ""  # the measured cluster it runs on ("": the plan's cluster)

    @property
    def key(self) -> tuple[str, str, str, int, str]:
        return (self.role, self.comm, self.trial, self.seed, self.where)


#: a timing run's key: the method a phase is sent as, and the knobs it is timed at
TimingKey = tuple[str, Knobs]


@dataclass
class Plan(Saved):
    """One protocol sweep, saved as ``<results>/ablation/<sweep_id>.plan.json``."""

    FOLDER, WHAT = "ablation", "protocol"

    sweep_id: str
    experiment: str = "dawnbench_digits"
    cluster: str = "emulated"
    comms: Sequence[str] = field(default_factory=methods.defaults)
    tune_seeds: Sequence[int] = TUNE_SEEDS
    eval_seeds: Sequence[int] = EVAL_SEEDS
    trials: int | None = None  # None: every trial of each space (--quick keeps one setting)
    order_seed: int = 0  # shuffles the configurations within each seed
    eval_every_steps: int = 0  # 0: the workload's EVAL_EVERY_STEPS
    results_dir: str = "results"
    cluster_overrides: Sequence[str] = ()
    extra: Sequence[str] = ()  # further Hydra overrides, applied to every job
    name: str = NAME
    recipe_lr: float = 0.0  # the experiment's learning rate (0: read from its config)
    # the measured clusters' profiles, the compute per step their first guess of the link
    # is priced with (s, timed when the sweep starts) and the CPU model their runs ran on
    measured: Sequence[str] = MEASURED
    carry_seeds: int = 3  # evaluation seeds run again at 8 nodes (bench.sweeps.carryover)
    link_compute_s: float = 0.0
    cpu_kind: str = ""  # recorded when the first measured run starts
    # how the jobs are submitted: "" = the local run queue, else a Hydra launcher
    launcher: str = ""
    launcher_overrides: Sequence[str] = ()
    notes: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, results_dir: str | Path, sweep_id: str) -> Plan:
        plan = super().load(results_dir, sweep_id)
        if plan.name != NAME:
            raise ConfigError(
                f"sweep {sweep_id} ran protocol {plan.name}, whose rules are retired from the "
                f"code: its committed tables stay as files, nothing resumes or rebuilds them "
                f"(results/README.md)"
            )
        return plan

    def check(self) -> None:
        check_names("experiment", [self.experiment], options("experiment"))
        check_names("cluster", [self.cluster], options("cluster"))
        # every training method (a measurement device such as nocomm trains nothing)
        known = [s.name for s in methods.specs() if s.kind != "reference"]
        check_names("comm", list(self.comms), known)
        if not self.eval_seeds or not self.tune_seeds:
            raise ConfigError("the protocol needs tuning seeds and evaluation seeds")
        shared = set(self.tune_seeds) & set(self.eval_seeds)
        if shared:
            raise ConfigError(f"tuning and evaluation seeds overlap: {sorted(shared)}")
        if len(set(self.eval_seeds)) != len(self.eval_seeds):
            raise ConfigError(f"evaluation seeds repeat: {list(self.eval_seeds)}")
        if self.measured:  # profiles at distinct ratios: one measured cluster each
            check_names("measured profile", list(self.measured), PROFILES)
            if len(measured_clusters(self)) != len(self.measured):
                raise ConfigError(f"measured profiles at one ratio: {list(self.measured)}")
        n = len(LR_FACTORS)
        if self.trials and self.trials % n:
            raise ConfigError(f"trials {self.trials}: whole knob settings of {n} rates each")
        ref = REF_STEPS[self.workload()]
        if self.every() > EVAL_SHARE * ref:
            raise ConfigError(
                f"an evaluation every {self.every()} steps is coarser than {EVAL_SHARE:.0%} "
                f"of dense's {ref} steps to target"
            )
        budget = BUDGET_STEPS[self.workload()]
        for c in self.comms:
            check_distinct(c, self._trials(c), budget)
            check_reached(c, self._space(c), REF_STEPS[self.workload()])
            check_placements(c, self._space(c), WORKLOAD_OPTIM[self.workload()])

    def check_jobs(self) -> None:
        jobs = [self.overrides(Job(TUNE, c, t, 0)) for c in self.comms for t, _ in self._space(c)]
        validate_jobs(jobs, self.results_dir)

    def _trials(self, comm: str) -> list[Trial]:
        return space(comm, self.lr(), self.trials, self.workload())

    def _space(self, comm: str) -> Space:
        return tuple((t.label, t.values()) for t in self._trials(comm))

    def lr(self) -> float:
        if not self.recipe_lr:
            from bench.sweeps.common import compose

            self.recipe_lr = float(compose([f"experiment={self.experiment}"]).optim.lr)
        return self.recipe_lr

    def workload(self) -> str:
        return "translation" if self.experiment in TRANSLATION else "classification"

    def every(self) -> int:
        return self.eval_every_steps or EVAL_EVERY_STEPS[self.workload()]

    def _order(self, items: list[Any], phase: str, seed: int) -> list[Any]:
        out = list(items)
        random.Random(f"{self.order_seed}/{phase}/{seed}").shuffle(out)
        return out

    def tune_jobs(self) -> list[Job]:
        trials = [(c, t) for c in self.comms for t, _ in self._space(c)]
        return [
            Job(TUNE, c, t, s) for s in self.tune_seeds for c, t in self._order(trials, TUNE, s)
        ]

    def eval_jobs(self, selected: Mapping[str, Mapping[str, str]]) -> list[Job]:
        """Seed-major: each configuration selected for a measured cluster on that cluster,
        one selected only for a projected cluster on the plan's; shuffled per seed and
        cluster."""
        where = {c: sorted(selected.get(c, {}).items()) for c in measured_clusters(self)}
        on = {ct for sel in where.values() for ct in sel}
        where[""] = sorted({ct for sel in selected.values() for ct in sel.items()} - on)
        return [
            Job(EVAL, c, t, s, w)
            for s in self.eval_seeds
            for w, configs in where.items()
            for c, t in self._order(configs, f"{EVAL}{w}", s)
        ]

    def timing_keys(self) -> dict[str, TimingKey]:
        """Label -> key of every phase a trial can send in within the budget, ordered by
        bucket, method, then knobs (the order the committed sweeps drew them in)."""
        sig = (tuple(self.comms), self.trials, self.experiment, self.lr())
        if self.__dict__.get("_timing", (None,))[0] != sig:  # a few hundred ms: once
            steps = BUDGET_STEPS[self.workload()]
            keys = {k for c in self.comms for _, v in self._space(c) for k in sends(c, v, steps)}
            order = sorted(
                keys, key=lambda mk: (mk[1].bucket_mb, mk[0], dataclasses.astuple(mk[1]))
            )
            self.__dict__["_timing"] = (
                sig,
                {methods.get(m).timing_label(k): (m, k) for m, k in order},
            )
        return self.__dict__["_timing"][1]

    def timing_jobs(self) -> list[Job]:
        """Each measured cluster in turn: every timing key once per TIMING_SEEDS round."""
        keys = self.timing_keys()
        return [
            Job(TIME, keys[label][0], label, s, where)
            for where in measured_clusters(self)
            for s in TIMING_SEEDS
            for label in self._order(list(keys), TIME, s)
        ]

    def common_overrides(self) -> list[str]:
        start = round(EVAL_FROM_SHARE * REF_STEPS[self.workload()])
        return job_base(self, LOCAL_TOPOLOGY, f"train.eval_every_steps={self.every()}",
                        "train.checkpoint_every=0", f"train.eval_from_step={start}",
                        f"train.eval_stride={EVAL_STRIDE[self.workload()]}")  # fmt: skip

    def _link(self, job: Job) -> list[str]:
        """``job``'s measured cluster and link: the model's guess in the first shaping round,
        else the rate shaping found (``measured.shaping``)."""
        if job.where not in measured_clusters(self):
            raise ConfigError(f"unknown measured cluster {job.where!r}; known: "
                              f"{', '.join(measured_clusters(self))}")  # fmt: skip
        k = int(job.trial.split()[-1]) if job.role == SHAPE else None
        rate, compute = self.__dict__.get("_links", {}).get((job.where, k)), self.link_compute_s
        if k == 0:
            pin = [f"cluster.profile_compute_s={compute:.6g}"] if compute else []
            link = [f"cluster.profile={measured_clusters(self)[job.where][0]}", *pin]
        elif rate:
            link = [f"cluster.inter_node_bandwidth={rate}", "cluster.profile=null"]
        else:
            raise ConfigError(f"{job.where}'s link is not shaped: nothing runs on it before")
        return ["cluster=emulated", *LOCAL_TOPOLOGY, *link, f"results.protocol_cluster={job.where}"]

    def overrides(self, job: Job) -> list[str]:
        common = self.common_overrides()
        if job.where:  # a measured cluster instead of the plan's: its shaped link
            common = [o for o in common if not o.startswith(("cluster=", "cluster."))]
            common += self._link(job)
        spec = methods.get(job.comm)
        if job.role in (TIME, SHAPE):  # a fixed number of steps on the clock: no evaluation
            timed = self.timing_keys()[job.trial] if job.role == TIME else None
            knobs = timed[1] if timed else spec.timing_knobs(spec.knobs_of({}))
            values = spec.timing_overrides(knobs)
            epochs, per_epoch = timing_steps((job.comm, knobs), self.workload())
            common += [
                f"train.epochs={epochs}",
                f"train.max_steps_per_epoch={per_epoch}",
                "train.stop_at_target=false",
                "train.eval_every_steps=0",
                "train.eval_stride=1",
                f"train.eval_every={epochs}",
            ]
        elif (trial := beyond(self._trials(job.comm), job.trial)) is not None:
            values = trial.values()  # of the grid, or a rate the extension added
        else:
            raise ConfigError(f"{job.comm}: no trial {job.trial!r} in the sweep's space")
        return [
            *common,
            *spec.overrides(),
            *(f"{k}={_value(v)}" for k, v in values.items()),
            f"train.seed={job.seed}",
            f"results.protocol={self.name}",
            f"results.protocol_role={job.role}",
            f"results.protocol_trial={job.trial}",
            f"results.protocol_selected={_value(job.role == EVAL)}",
        ]


# the fields chosen when a sweep starts (a rerun of its command does not choose them again)
START_FIELDS = ("order_seed", "cluster_overrides", "recipe_lr", "link_compute_s", "cpu_kind")
TIMING_SEEDS = (2000, 2001)  # the timing pass's rounds (never a tuning or evaluation seed)
# a shaping round's seeds, and its most rounds per measured cluster
SHAPE_SEEDS, SHAPE_ROUNDS = TIMING_SEEDS, 5
TIMING_STEPS = {"classification": 20, "translation": 30}  # optimizer steps per timing run
# optimizer steps per epoch of each workload's recipe at 2 x 2 (BUDGET_STEPS / its epochs)
STEPS_PER_EPOCH = {"classification": 11, "translation": 310}


def timing_steps(key: TimingKey, workload: str) -> tuple[int, int]:
    """(epochs, steps per epoch) of a timing run: TIMING_STEPS, whole periods of the
    method's exchange, in as few epochs as fit."""
    h = methods.get(key[0]).period(key[1])
    n = h * max(1, math.ceil(TIMING_STEPS[workload] / h))
    spe = STEPS_PER_EPOCH[workload]
    per = max(d for d in range(1, min(n, spe) + 1) if n % d == 0)
    return n // per, per


def job_of(rec: Mapping[str, Any]) -> Job | None:
    """The job a record ran; None if not a protocol run."""
    p, cfg = rec.get("protocol") or {}, rec.get("config") or {}
    if not p.get("role"):
        return None
    seed = (cfg.get("train") or {}).get("seed")
    where = str((cfg.get("results") or {}).get("protocol_cluster") or "")
    return Job(str(p["role"]), methods.method_of(rec), str(p.get("trial")), int(seed or 0), where)


def _key(rec: Mapping[str, Any]) -> tuple[str, str, str, int, str] | None:
    j = job_of(rec)
    return j.key if j is not None else None


def recorded(
    records: Sequence[Mapping[str, Any]], rerun: Sequence[str] = RERUN
) -> dict[tuple[str, str, str, int, str], dict]:
    """Job key -> its latest record, but those whose latest status is in ``rerun``."""
    return latest(records, _key, rerun)  # type: ignore[return-value]


def pending(
    jobs: Sequence[Job], records: Sequence[Mapping[str, Any]], rerun: Sequence[str] = RERUN
) -> list[Job]:
    done = recorded(records, rerun)
    return [j for j in jobs if j.key not in done]


def status(plan: Plan, records: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = [
        progress(stage, [j.key for j in jobs], records, _key)
        for stage, jobs in (("tuning", plan.tune_jobs()), ("timing pass", plan.timing_jobs()))
    ]
    ext = extend(plan, records)
    line = progress("rate extension", [j.key for j in ext.jobs], records, _key)
    lines.append(f"{line} in {ext.rounds} round(s)" + ("" if ext.settled else ", more to decide"))
    lines += [extension.bound_note(ext)] if ext.at_edge else []
    if not ext.settled:
        n = len(plan.comms) * len(plan.eval_seeds)  # one more set per other selection
        return [*lines, f"evaluation: at least {n} runs, submitted once tuning is recorded"]
    ev = plan.eval_jobs(chosen(plan, records))
    return [*lines, progress("evaluation", [j.key for j in ev], records, _key)]


# wall seconds per run on the 2-core machine: image measured on 2026-12-03 (a --quick
# sweep: tuning a median 21 s, timing 8 s, evaluation on the emulated cluster 18-41 s);
# translation 50 s of training, about 4 decodings of 2.5 s and the start, misses 2.5x longer;
# "carry", a steps carry-over run on 8 x 2 (16 workers, 4x the work a step): assumed 4x local
RUN_S = {
    "classification": {TUNE: 21.0, TIME: 9.0, "local": 21.0, "measured": 30.0, "carry": 84.0},
    "translation": {TUNE: 70.0, TIME: 20.0, "local": 60.0, "measured": 75.0, "carry": 240.0},
}


def estimate(plan: Plan) -> tuple[int, int, float, float]:
    """(fewest runs, most runs, fewest minutes, most minutes) of ``plan`` on the 2-core
    machine: fewest with one shaping round, no rate extension and one configuration per
    method; most with every round and one configuration per method and cluster."""
    s = RUN_S[plan.workload()]
    tune, timing = len(plan.tune_jobs()), len(plan.timing_jobs())
    m = len(measured_clusters(plan))
    k, n = len(clusters(plan)) - m, len(plan.comms)
    per = n * len(plan.eval_seeds)
    cells = (plan.trials or TRIALS) // len(LR_FACTORS)  # --quick keeps fewer
    more = extension.most_runs(n, m + k, cells, len(plan.tune_seeds))
    few = m * 2 * len(SHAPE_SEEDS)  # one round of dense and the reference per cluster
    most = few * SHAPE_ROUNDS
    fixed = tune * s[TUNE] + timing * s[TIME]
    low = fixed + few * s[TIME] + per * (m * s["measured"] if m else s["local"])
    high = fixed + most * s[TIME] + more * s[TUNE] + per * (m * s["measured"] + k * s["local"])
    c_lo, c_hi = 2 * plan.carry_seeds, n * (m + k) * plan.carry_seeds
    low, high = low + c_lo * s["carry"], high + c_hi * s["carry"]
    runs = tune + timing
    lo_runs, hi_runs = (
        runs + few + per * max(m, 1) + c_lo,
        runs + most + more + per * (m + k) + c_hi,
    )
    return lo_runs, hi_runs, low / 60, high / 60


def chosen(plan: Plan, records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    return select_per_cluster(selection_table(plan, records))


def complete(plan: Plan, records: Sequence[Mapping[str, Any]]) -> bool:
    if not extend(plan, records).settled:
        return False
    return not pending(plan.eval_jobs(chosen(plan, records)), records)


def select(tuning: pd.DataFrame) -> dict[str, str]:
    """Per method, the trial of lowest median time to target; ties, and a method without a
    time, go to the trial declared first."""
    out = {}
    for comm, g in tuning.groupby("comm", sort=False):
        g = g.sort_values("order", kind="stable")
        out[str(comm)] = str(g.loc[g["median_time_s"].fillna(math.inf).idxmin(), "trial"])
    return out


def extend(plan: Plan, records: Sequence[Mapping[str, Any]]) -> extension.Extension:
    """The rate extension's rounds that ``records`` decide: none before every tuning and
    timing run is recorded, then one round after another while each round's are."""
    ext = extension.Extension({c: list(plan._trials(c)) for c in plan.comms}, [])
    if pending([*plan.tune_jobs(), *plan.timing_jobs()], records, RERUN_FAILED):
        return ext
    for r in range(1, extension.MAX_ROUNDS + 2):
        new, edge = extension.next_round(selection_table(plan, records, ext.trials), ext.trials, r)
        if not new or r > extension.MAX_ROUNDS:
            ext.settled, ext.at_edge = True, edge
            break
        for comm, t in new:
            ext.trials[comm].append(t)
        added = [(c, t.label) for c, t in new]
        mine = [Job(TUNE, c, t, s) for s in plan.tune_seeds
                for c, t in plan._order(added, f"extension {r}", s)]  # fmt: skip
        ext.jobs += mine
        if pending(mine, records, RERUN_FAILED):
            break
    return ext


def measured_clusters(plan: Plan) -> dict[str, tuple[str, float]]:
    """Measured cluster (``measured-1.34``) -> (its profile, the ratio it is shaped to)."""
    from bench.sweeps.ratios import named_ratios

    named = named_ratios()
    return {f"measured-{named[p]:.2f}": (p, named[p]) for p in plan.measured}


def clusters(plan: Plan) -> dict[str, float | None]:
    """The clusters a number is quoted for: the measured ones (None), then the paper's
    cluster at each named ratio (``paper-fp16`` is ``paper``'s point)."""
    from bench.sweeps.ratios import named_ratios

    named = {k: v for k, v in named_ratios().items() if k != "paper-fp16"}
    mine = dict.fromkeys(measured_clusters(plan))
    return {**mine, **dict(sorted(named.items(), key=lambda kv: kv[1]))}


def step_s(rec: Mapping[str, Any]) -> float | None:
    """A run's training time over the steps it ran (its phase log, else its epochs'), s;
    None for a run that ended in error."""
    if rec.get("status") not in ("ok", "target_missed"):
        return None
    steps = sum(int(p.get("steps", 0)) for p in rec.get("comm_phases") or [])
    if not steps:
        cfg = (rec.get("config") or {}).get("train") or {}
        steps = int(cfg.get("max_steps_per_epoch") or 0) * int(rec.get("epochs_run") or 0)
    t = (rec.get("train_time_s") or 0) / steps if steps else rec.get("step_time_s")
    return float(t) if t else None


def run_of(plan: Plan, rec: Mapping[str, Any]) -> Any:
    """``rec``'s :func:`~bench.sweeps.ratios.run_from_record`, cached per plan; None
    without a curve."""
    from bench.results.records import load_curve
    from bench.sweeps.ratios import run_from_record

    cache, rid = plan.__dict__.setdefault("_runs", {}), str(rec["run_id"])
    if rid not in cache:
        try:
            cache[rid] = run_from_record(rec, load_curve(plan.results_dir, rid))
        except FileNotFoundError:
            return None
    return cache[rid]


def phase_sends(run: Any, rec: Mapping[str, Any]) -> list[tuple[int, str, Knobs]]:
    """(steps, method, timing knobs) of each phase of ``run``, at the phase's density."""
    cfg = rec.get("config") or {}
    out = []
    for p in run.phases:
        spec = methods.get(p.method)
        knobs = spec.knobs_of({**cfg, "comm.density": p.density})
        out.append((p.steps, p.method, spec.timing_knobs(knobs)))
    return out


def cluster_time(
    run: Any, sent: Sequence[tuple[int, str, Knobs]], ratio: float | None,
    times: Mapping[TimingKey, float],
) -> float:  # fmt: skip
    """A run's time to target (missed: its whole run): its steps x the model's time per
    step at ``ratio``, or (None) the timing pass's of each phase."""
    from bench.sweeps.ratios import run_time_s

    if ratio is not None:
        return run_time_s(run, ratio)
    if any((m, k) not in times for _, m, k in sent):
        return math.nan
    return sum(n * times[(m, k)] for n, m, k in sent)


def selection_table(
    plan: Plan,
    records: Sequence[Mapping[str, Any]],
    trials: Mapping[str, Sequence[Trial]] | None = None,
) -> pd.DataFrame:
    """The tuning table: per (method, trial, cluster) the median time to target over the
    tuning seeds, and whether the rule selects it.  ``trials`` default: :func:`extend`'s."""
    if trials is None:
        trials = extend(plan, records).trials
    runs = [r for r in recorded(records).values() if (r.get("protocol") or {}).get("role") == TUNE]
    # per measured cluster: timing key -> the median time per step of its timing runs (s)
    got: dict[str, dict[TimingKey, list[float]]] = {
        c: {} for c, ratio in clusters(plan).items() if ratio is None
    }
    for r in recorded(records).values():
        spec, job = methods.of(r), job_of(r)
        if job and job.role == TIME and job.where in got and spec and (t := step_s(r)):
            key = (spec.name, spec.timing_knobs(spec.knobs_of(r.get("config") or {})))
            got[job.where].setdefault(key, []).append(t)
    times = {c: {k: statistics.median(v) for k, v in g.items()} for c, g in got.items()}
    rows = []
    for comm in plan.comms:
        edges = extension.at_edge(trials[comm])
        for order, t in enumerate(trials[comm]):
            trial, values = t.label, t.values()
            mine = [r for r in runs if job_of(r).comm == comm and r["protocol"]["trial"] == trial]  # type: ignore[union-attr]
            done = [(r, run, phase_sends(run, r)) for r in mine if (run := run_of(plan, r))]
            for cluster, ratio in clusters(plan).items():
                ts = [cluster_time(run, sent, ratio, times.get(cluster, {}))
                      for _, run, sent in done]  # fmt: skip
                rows.append(
                    {
                        "sweep_id": plan.sweep_id,
                        "protocol": plan.name,
                        "comm": comm,
                        "trial": trial,
                        "order": order,
                        "overrides": " ".join(f"{k}={_value(v)}" for k, v in values.items()),
                        "cluster": cluster,
                        "ratio": math.nan if ratio is None else ratio,
                        "n_runs": len(mine),
                        "n_reached": sum(run.reached for _, run, _ in done),
                        "median_steps": statistics.median([run.steps for _, run, _ in done])
                        if done
                        else math.nan,
                        "median_time_s": statistics.median(ts) if ts else math.nan,
                        "ran": " | ".join(sorted({ran(sent) for _, _, sent in done})),
                        "seeds": " ".join(str(job_of(r).seed) for r, _, _ in done),  # type: ignore[union-attr]
                        "run_ids": " ".join(str(r["run_id"]) for r in mine),
                        "extension": t.round,
                        "rate_at_edge": trial in edges,
                    }
                )
    df = pd.DataFrame(rows)
    df["selected"] = False
    for cluster, picked in select_per_cluster(df).items():
        for comm, trial in picked.items():
            hit = (df["cluster"] == cluster) & (df["comm"] == comm) & (df["trial"] == trial)
            df.loc[hit, "selected"] = True
    return df


def select_per_cluster(table: pd.DataFrame) -> dict[str, dict[str, str]]:
    """:func:`select` per cluster."""
    return {str(cluster): select(g) for cluster, g in table.groupby("cluster", sort=False)}
