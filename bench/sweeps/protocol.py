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
import re
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
from bench.sweeps.methods import (
    COMMS,
    DEFAULT_METHODS,
    METHODS,
    UNPRICED,
    method_comm,
    method_of,
    method_overrides,
)
from bench.sweeps.resume import RERUN, RERUN_FAILED, Saved, latest, progress
from bench.sweeps.trials import (
    TRIALS,
    Knobs,
    Option,
    Trial,
    check_distinct,
    draw,
    ran,
    schedule,
)

NAME = "equal-budget-v2"  # the protocol's name in every record; change it with the rules
V1 = "equal-budget-v1"  # the rules the committed sweeps ran (their plans still load and rebuild)
PAPER_METHODS = ("hitopk", "mstopk")  # the paper's; every other method is a peer
TUNE_SEEDS = (1000, 1001)  # tuning only: never an evaluation seed
EVAL_SEEDS = tuple(range(10))  # at least 10 per method and workload (v1: 5)
MIN_EVAL_SEEDS = 10
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
# v2, to keep a run's evaluation overhead under 30 % of its training time: no evaluation
# before EVAL_FROM_SHARE of dense's steps to target (REF_STEPS; no configuration of the
# committed sweeps reached it in under 0.7 of them), and only every EVAL_STRIDE-th point
# evaluated, the models between kept and evaluated once one reaches the target
# (train.eval_stride: the same first step at EVAL_EVERY_STEPS resolution)
EVAL_FROM_SHARE = 0.4
EVAL_STRIDE = {"classification": 3, "translation": 4}
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
# v2: steps to target are measured where they are cheapest, on the local cluster at the
# emulated cluster's 2 x 2 topology (the same gradients, so the same steps); the clock of
# the emulated cluster (its paper-scaled link) is the timing pass and the end-to-end check.
WORKLOAD_DEFAULTS: dict[str, dict[str, Any]] = {
    "image": {"cluster": "local", "local_topology": (2, 2)},
    "translation": {
        "cluster": "local",
        "tune_seeds": (1000,),
        "local_topology": (2, 2),
    },
}
QUICK = {"comms": ("dense", "hitopk"), "tune_seeds": (1000,), "eval_seeds": (0,), "trials": 2}
TUNE, EVAL, TIME = "tune", "eval", "time"

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
#: v1 (the committed sweeps): comm -> its trials; a method not named has one
V1_SPACES: dict[str, Space] = {
    **{c: _sparse_space() for c in SPARSE},
    "powersgd": _POWERSGD_SPACE,
}
#: v1: workload -> comm -> its trials where the default's do not fit (as many)
V1_WORKLOAD_SPACES = {"translation": {c: _sparse_space((0.05, 0.01)) for c in SPARSE}}

# -- v2: every method's own knobs x the learning rate, TRIALS drawn per method -------------
# dense's optimizer steps to target on the tuning seeds of the committed sweeps (image 55-65,
# translation 220-260): the step axis of every schedule, fixed before the sweep
REF_STEPS = {"classification": 60, "translation": 240}
# the budget in optimizer steps (the recipe's epochs x steps per epoch at 2 x 2): trials that
# send alike up to it are one trial (Plan.check refuses them)
BUDGET_STEPS = {"classification": 132, "translation": 620}
WARMUP_SHARE = 0.25  # the sparse warm-up: WARMUP_SCHEDULE over this share of REF_STEPS
START_SHARE = 0.10  # PowerSGD's later start: torch's "about 10 % of the steps to target"
BUCKETS_MB = (6.25, 25.0, 100.0)  # DDP's bucket size (25: its default)


def _buckets() -> Knobs:
    return {"bucket": tuple((f"b{b:g}", {"comm.bucket_cap_mb": b}) for b in BUCKETS_MB)}


def _powersgd_knobs(ref: int) -> Knobs:
    late = max(3, round(START_SHARE * ref))
    return {
        "rank": tuple((f"rank{r}", {"comm.powersgd_rank": r}) for r in (4, 8)),
        "start": (
            ("start2", {"comm.warmup_steps": 0}),
            (f"start{late}", {"comm.warmup_steps": late}),
        ),
    }


def _sparse_knobs(ref: int, densities: tuple[float, ...] = (0.01, 0.001)) -> Knobs:
    """density {none, warm-up} x final ``densities``: the warm-up sends the schedule's
    densities above the final one over WARMUP_SHARE of ``ref`` steps (each alike), then
    the final one, so every labelled density is sent well before dense's target."""
    opts: list[Option] = []
    for d in densities:
        above = [x for x in WARMUP_SCHEDULE if x > d]
        every = max(1, round(WARMUP_SHARE * ref / len(above)))
        opts.append((f"d{d:g}", {"comm.density": d, "comm.density_schedule": []}))
        opts.append(
            (
                f"d{d:g}-warmup{every * len(above)}",
                {
                    "comm.density": d,
                    "comm.density_schedule": [*above, d],
                    "comm.schedule_steps": every,
                },
            )
        )
    return {"schedule": tuple(opts)}


def _placement_knob(*names: str, **extra: Any) -> Knobs:
    """Where a sparse method compresses (bench/comm/placement.py): one option per name."""
    return {"placement": tuple((n, {"comm.placement": n, **extra}) for n in names)}


def _image_sparse_knobs(ref: int) -> Knobs:
    """SGD with momentum: the density schedule x placement {grad, grad+dgc} (DGC)."""
    return {**_sparse_knobs(ref), **_placement_knob("grad", "grad+dgc")}


def _translation_sparse_knobs(ref: int) -> Knobs:
    """AdamW: final density {0.05, 0.01} from the first sparse step x placement {grad,
    update}, each after the same dense warm-up (Adam's variance; docs/algorithms.md s. 8)."""
    dens = {"density": tuple((f"d{d:g}", {"comm.density": d}) for d in (0.05, 0.01))}
    warm = round(WARMUP_DENSE_SHARE * ref)
    return {**dens, **_placement_knob("grad", "update", **{"comm.warmup_steps": warm})}


# the translation sparse methods' dense warm-up: about 16 % of dense's steps to target
WARMUP_DENSE_SHARE = 1 / 6


def _demo_knobs(ref: int) -> Knobs:
    """DeMo (bench/optim/demo.py): (chunk, top-k) per chunk."""
    pairs = ((64, 32), (32, 4))
    return {
        "chunk": tuple(
            (f"c{c}k{k}", {"optim.demo_chunk": c, "optim.demo_topk": k}) for c, k in pairs
        )
    }


def _localsgd_knobs(hs: tuple[int, ...]) -> Callable[[int], Knobs]:
    return lambda ref: {"H": tuple((f"H{h}", {"sync.sync_every": h}) for h in hs)}


def _diloco_knobs(hs: tuple[int, ...], streaming: bool = False) -> Callable[[int], Knobs]:
    """DiLoCo: H x outer learning rate, outer momentum 0.5; streaming: 2 fragments, each
    synchronised with a delay of 1 inner step."""
    extra = {"sync.fragments": 2, "sync.fragment_sync_delay": 1} if streaming else {}

    def knobs(ref: int) -> Knobs:
        return {
            "H": tuple((f"H{h}", {"sync.sync_every": h}) for h in hs),
            "outer": tuple(
                (f"olr{o:g}", {"sync.outer_lr": o, "sync.outer_momentum": 0.5, **extra})
                for o in (0.5, 0.7)
            ),
        }

    return knobs


#: comm -> its own knobs (knob -> options), or a function of the workload's REF_STEPS
#: giving them; the protocol crosses them with LR_FACTORS and draws TRIALS per method, so
#: a method added here gets the same number of trials as every other
SPACES: dict[str, Knobs | Callable[[int], Knobs]] = {
    "dense": _buckets(),
    "fp16": _buckets(),
    "bf16": _buckets(),
    "powersgd": _powersgd_knobs,
    **{c: _image_sparse_knobs for c in SPARSE},
    "demo": _demo_knobs,
    "localsgd": _localsgd_knobs((5, 10, 20, 40)),
    "diloco": _diloco_knobs((10, 20)),
    "streaming_diloco": _diloco_knobs((10, 20), streaming=True),
}
#: workload -> comm -> its knobs where the default's do not fit: the embedded Transformer
#: (AdamW) barely learns at density 0.01 and learns at 0.05 (docs/protocol.md); there the
#: placement is grad or update (1-bit Adam's), each after WARMUP_DENSE dense steps
WORKLOAD_SPACES: dict[str, dict[str, Knobs | Callable[[int], Knobs]]] = {
    "translation": {
        **{c: _translation_sparse_knobs for c in SPARSE},
        "localsgd": _localsgd_knobs((20, 50)),
        "diloco": _diloco_knobs((20, 50)),
        "streaming_diloco": _diloco_knobs((20, 50), streaming=True),
    }
}
#: method -> workload -> the centre of its learning-rate axis where the recipe's does not
#: apply: DeMo's update is the sign of its averaged compressed momentum, so its rate is a
#: step per coordinate (AdamW's scale), not SGD's; on translation the recipe's AdamW rate
#: is DeMo's own default (conf/optim/demo.yaml)
# DeMo's rate on digits, fixed before the sweep from a scan on tuning seed 1000 (chunk 32,
# top-k 4, 2 x 2): 0.05 reached 98 % in 98 steps, 0.1 in 94; the recipe's SGD rate 0.4
# (chunk 64, top-k 32) never did (89 %).  The axis is 0.5x-2x of it, like every method's.
DEMO_IMAGE_LR = 0.1
METHOD_LR: dict[str, dict[str, float]] = {"demo": {"classification": DEMO_IMAGE_LR}}
#: the optimizer each workload's recipe trains with (the placements' fit is checked on it)
WORKLOAD_OPTIM = {"classification": "sgd", "translation": "adamw"}


def knobs(comm: str, workload: str = "classification") -> Knobs:
    """``comm``'s own knobs on ``workload`` (a method not named: the bucket size)."""
    k = WORKLOAD_SPACES.get(workload, {}).get(comm) or SPACES.get(comm) or _buckets()
    return k(REF_STEPS[workload]) if callable(k) else k


def local_topology(workload: str) -> list[str]:
    """The local cluster's topology overrides for ``workload`` (classification or
    translation, :meth:`Plan.workload`): by default 2 launcher agents of one worker each
    (hitopk needs 2 nodes; every method trains on the same topology)."""
    name = "translation" if workload == "translation" else "image"
    n, m = WORKLOAD_DEFAULTS[name].get("local_topology", (2, 1))
    return [f"cluster.nnodes={n}", f"cluster.nproc_per_node={m}"]


def space(comm: str, trials: int | None = None, workload: str = "classification") -> Space:
    """v1's search space of ``comm`` on ``workload``: (trial label, CommConfig field
    values), in declared order; ``trials`` keeps the first that many (the quick protocol)."""
    HOOKS.get(comm)  # an unknown name fails here, listing the known ones
    s = V1_WORKLOAD_SPACES.get(workload, {}).get(comm) or V1_SPACES.get(comm, DEFAULT_SPACE)
    return s[:trials] if trials else s


def space_v2(
    comm: str, recipe_lr: float, trials: int | None = None, workload: str = "classification"
) -> Space:
    """v2's trials of ``comm``: TRIALS points of its knobs x the learning rate (trial
    label, Hydra overrides keyed in full), ``trials`` keeps the first that many."""
    method_overrides(comm)
    lr = METHOD_LR.get(comm, {}).get(workload, recipe_lr)
    drawn = draw(knobs(comm, workload), lr, TRIALS)
    out = tuple((t.label, t.values()) for t in drawn)
    return out[:trials] if trials else out


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
    where: str = ""  # the cluster it runs on when not the plan's (v2: the end-to-end check)

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
    comms: Sequence[str] = DEFAULT_METHODS
    tune_seeds: Sequence[int] = TUNE_SEEDS
    eval_seeds: Sequence[int] = EVAL_SEEDS
    trials: int | None = None  # None: every trial of each space (QUICK keeps 2)
    order_seed: int = 0  # shuffles the configurations within each seed
    eval_every_steps: int = 0  # 0: the workload's EVAL_EVERY_STEPS
    results_dir: str = "results"
    cluster_overrides: Sequence[str] = ()
    extra: Sequence[str] = ()  # further Hydra overrides, applied to every job
    name: str = NAME
    recipe_lr: float = 0.0  # v2: the experiment's learning rate (0: read from its config)
    # v2: the cluster of the end-to-end check (timing pass, its selected configurations'
    # evaluation runs on the clock), with its overrides (the paper-scaled profile)
    check_cluster: str = "emulated"
    check_overrides: Sequence[str] = ()
    # how the jobs are submitted (not what they are): "" = the local run queue, else a
    # Hydra launcher (bench.launch.submit) and its hydra.* overrides
    launcher: str = ""
    launcher_overrides: Sequence[str] = ()
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.v2() and tuple(self.comms) == DEFAULT_METHODS:
            self.comms = COMMS  # v1's rules knew the comm hooks alone

    # -- checks -------------------------------------------------------------------------
    def check(self) -> None:
        """Names known, seeds disjoint and enough of them (ConfigError otherwise)."""
        check_names("experiment", [self.experiment], options("experiment"))
        check_names("cluster", [self.cluster], options("cluster"))
        # every training method (a measurement device such as nocomm trains nothing)
        known = [*COMMS, *(c for c in HOOKS if c not in COMMS and not HOOKS.get(c).measurement)]
        known = [c for c in known if c in options("comm")]
        check_names("comm", list(self.comms), [*known, *(METHODS if self.v2() else ())])
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
        if self.v2():
            budget = BUDGET_STEPS[self.workload()]
            for c in self.comms:
                trials = [Trial(t, tuple(v.items())) for t, v in self._space(c)]
                check_distinct(method_comm(c), trials, budget)
                self._check_reached(c)
                self._check_placements(c)

    def _check_placements(self, comm: str) -> None:
        """Every placement a trial names fits the workload's optimizer (and ``update`` has
        its dense warm-up): bench.comm.placement's own refusal, before the sweep."""
        from bench.comm.config import Placement
        from bench.comm.placement import FITS

        optim = WORKLOAD_OPTIM[self.workload()]
        for label, values in self._space(comm):
            p = values.get("comm.placement")
            if p is None or p == Placement.grad.value:
                continue
            fits = FITS.get(Placement(p), ())
            if comm not in SPARSE or optim not in fits:
                raise ConfigError(
                    f"{comm} {label}: placement {p} does not fit {self.workload()}'s "
                    f"optimizer {optim} (it needs a sparse method and {' or '.join(fits)})"
                )
            if p == Placement.update.value and not int(values.get("comm.warmup_steps", 0)):
                raise ConfigError(f"{comm} {label}: placement update needs comm.warmup_steps > 0")

    def _check_reached(self, comm: str) -> None:
        """Every density a trial is labelled with is sent before dense's steps to target."""
        ref = REF_STEPS[self.workload()]
        for label, values in self._space(comm):
            final = values.get("comm.density")
            if comm not in SPARSE or final is None:
                continue
            steps = schedule(values, comm, ref)[0]
            if float(final) not in steps:
                raise ConfigError(
                    f"{comm} {label}: density {final:g} is not reached within {ref} steps"
                )

    def check_jobs(self) -> None:
        """Every (method, trial) composes and passes the run's own checks."""
        jobs = [self.overrides(Job(TUNE, c, t, 0)) for c in self.comms for t, _ in self._space(c)]
        validate_jobs(jobs, self.results_dir)

    # -- jobs ---------------------------------------------------------------------------
    def v2(self) -> bool:
        return self.name != V1

    def _space(self, comm: str) -> Space:
        """(label, Hydra overrides keyed in full) of each trial of ``comm``."""
        if self.v2():
            return space_v2(comm, self.lr(), self.trials, self.workload())
        return tuple(
            (t, {f"comm.{k}": v for k, v in vals.items()})
            for t, vals in space(comm, self.trials, self.workload())
        )

    def lr(self) -> float:
        """The recipe's learning rate (read once from the experiment's config)."""
        if not self.recipe_lr:
            from bench.sweeps.common import compose

            self.recipe_lr = float(compose([f"experiment={self.experiment}"]).optim.lr)
        return self.recipe_lr

    def workload(self) -> str:
        return "translation" if self.experiment in TRANSLATION else "classification"

    def every(self) -> int:
        return self.eval_every_steps or EVAL_EVERY_STEPS[self.workload()]

    def _eval_schedule(self) -> list[str]:
        """v2: no checkpoints, evaluations from EVAL_FROM_SHARE of REF_STEPS, strided."""
        w = self.workload()
        start = round(EVAL_FROM_SHARE * REF_STEPS[w])
        return [
            "train.checkpoint_every=0",
            f"train.eval_from_step={start}",
            f"train.eval_stride={EVAL_STRIDE[w]}",
        ]

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

    def eval_jobs(self, selected: Mapping[str, Any]) -> list[Job]:
        """Seed-major: each method's selected trial on one evaluation seed, shuffled.  v2:
        ``selected`` is per cluster (:func:`select_per_cluster`): each configuration
        selected for any cluster runs once per seed, on the check cluster when it was
        selected for it (its clock is the end-to-end check), else on the plan's cluster."""
        if not self.v2():
            return [
                Job(EVAL, c, selected[c], s)
                for s in self.eval_seeds
                for c in self._order(list(self.comms), EVAL, s)
            ]
        check = selected.get(self.check_cluster, {})
        configs = sorted({(c, t) for sel in selected.values() for c, t in sel.items()})
        return [
            Job(EVAL, c, t, s, self.check_cluster if check.get(c) == t else "")
            for s in self.eval_seeds
            for c, t in self._order(configs, EVAL, s)
        ]

    def timing_keys(self) -> list[TimingKey]:
        """v2: every (bucket, method, density, rank, knobs) a trial can send in, each timed
        on the check cluster (:meth:`timing_jobs`): a comm hook's phases, DeMo's (chunk,
        top-k), a sync strategy's (H, fragments, delay)."""
        keys = set()
        for comm in self.comms:
            if comm in UNPRICED:  # no per-step price to compose (unpriced(): stated)
                continue
            for _, v in self._space(comm):
                b = float(v.get("comm.bucket_cap_mb", 25.0))
                if comm == "powersgd":
                    keys.add((b, "dense", 1.0, 0, ()))
                    keys.add((b, comm, 1.0, int(v.get("comm.powersgd_rank", 4)), ()))
                elif comm in SPARSE:
                    for d in {float(v["comm.density"]), *v.get("comm.density_schedule", [])}:
                        keys.add((b, comm, float(d), 0, ()))
                    if int(v.get("comm.warmup_steps", 0)):
                        keys.add((b, "dense", 1.0, 0, ()))
                elif comm == "demo":
                    keys.add((b, comm, 1.0, 0, _demo_knobs_of(v)))
                elif comm in METHODS:
                    keys.add((b, comm, 1.0, 0, _sync_knobs_of(v)))
                else:
                    keys.add((b, comm, 1.0, 0, ()))
        return sorted(keys)

    def timing_jobs(self) -> list[Job]:
        """v2: the interleaved timing pass on the check cluster: every timing key once per
        round (TIMING_ROUNDS rounds, each shuffled), one epoch each without evaluation."""
        if not self.v2():
            return []
        keys = [_timing_label(k) for k in self.timing_keys()]
        return [
            Job(TIME, _timing_key(label)[1], label, s, self.check_cluster)
            for s in TIMING_SEEDS
            for label in self._order(keys, TIME, s)
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
            *(self._eval_schedule() if self.v2() else []),
            *self.extra,
        ]

    def overrides(self, job: Job) -> list[str]:
        """The Hydra overrides of one job: the trial's comm fields, seed and protocol tags."""
        if job.role == TIME:
            values = _timing_values(job.trial)
        else:
            values = dict(self._space(job.comm))[job.trial]
        where = []
        if job.where and job.where != self.cluster:  # the check cluster instead of the plan's
            where = [f"cluster={job.where}", *self.check_overrides]
        common = self.common_overrides()
        if where:
            common = [o for o in common if not o.startswith(("cluster=", "cluster."))] + where
        if job.role == TIME:  # a fixed number of steps on the clock: no evaluation
            epochs, per_epoch = timing_steps(_timing_key(job.trial), self.workload())
            common += [
                f"train.epochs={epochs}",
                f"train.max_steps_per_epoch={per_epoch}",
                "train.stop_at_target=false",
                "train.eval_every_steps=0",
                "train.eval_stride=1",
                f"train.eval_every={epochs}",
            ]
        return [
            *common,
            *method_overrides(job.comm),
            *(f"{k}={_value(v)}" for k, v in values.items()),
            f"train.seed={job.seed}",
            f"results.protocol={self.name}",
            f"results.protocol_role={job.role}",
            f"results.protocol_trial={job.trial}",
            f"results.protocol_selected={_value(job.role == EVAL)}",
        ]


# the fields chosen when a sweep starts (a rerun of its command does not choose them again)
START_FIELDS = ("order_seed", "cluster_overrides", "check_overrides", "recipe_lr")
TIMING_SEEDS = (2000, 2001)  # the timing pass's rounds (never a tuning or evaluation seed)
TIMING_STEPS = {"classification": 20, "translation": 30}  # optimizer steps per timing run


TimingKey = tuple[float, str, float, int, tuple[int, ...]]  # bucket, method, density, rank, knobs
# optimizer steps per epoch of each workload's recipe at 2 x 2 (BUDGET_STEPS / its epochs)
STEPS_PER_EPOCH = {"classification": 11, "translation": 310}


def _demo_knobs_of(values: Mapping[str, Any]) -> tuple[int, ...]:
    return (int(values.get("optim.demo_chunk", 64)), int(values.get("optim.demo_topk", 32)))


def _sync_knobs_of(values: Mapping[str, Any]) -> tuple[int, ...]:
    return (
        int(values.get("sync.sync_every", 10)),
        int(values.get("sync.fragments", 1)),
        int(values.get("sync.fragment_sync_delay", 0)),
    )


def timing_steps(key: TimingKey, workload: str) -> tuple[int, int]:
    """(epochs, steps per epoch) of a timing run of ``key``: TIMING_STEPS optimizer steps,
    for a sync strategy whole periods of H (at least one), in as few epochs as fit."""
    n = TIMING_STEPS[workload]
    method, knobs = key[1], key[4]
    if method in METHODS and method != "demo":
        h = knobs[0]
        n = h * max(1, math.ceil(n / h))
    spe = STEPS_PER_EPOCH[workload]
    per = max(d for d in range(1, min(n, spe) + 1) if n % d == 0)
    return n // per, per


def _timing_label(key: TimingKey) -> str:
    b, method, d, r, knobs = key
    if method == "powersgd":
        what = [f"rank{r}"]
    elif method == "demo":
        what = [f"chunk{knobs[0]}", f"topk{knobs[1]}"]
    elif knobs:
        what = [f"H{knobs[0]}", f"frag{knobs[1]}", f"delay{knobs[2]}"]
    else:
        what = [f"d{d:g}"] if d < 1.0 else []
    return " ".join(["time", method, *what, f"b{b:g}"])


def _timing_key(label: str) -> TimingKey:
    """The key a timing job's label names (:func:`_timing_label`)."""
    parts = label.split()
    method, b, d, r, knobs = parts[1], 25.0, 1.0, 0, []
    for p in parts[2:]:
        if p.startswith("rank"):
            r = int(p[4:])
        elif p.startswith(("chunk", "topk", "frag", "delay", "H")):
            knobs.append(int(re.sub(r"^\D+", "", p)))
        elif p.startswith("d"):
            d = float(p[1:])
        elif p.startswith("b"):
            b = float(p[1:])
    return (b, method, d, r, tuple(knobs))


def _timing_values(label: str) -> dict[str, Any]:
    """A timing job's overrides from its label (:func:`_timing_label`)."""
    b, method, d, r, knobs = _timing_key(label)
    out: dict[str, Any] = {}
    if method == "powersgd":
        out["comm.powersgd_rank"] = r
    elif method == "demo":
        out["optim.demo_chunk"], out["optim.demo_topk"] = knobs
        return out  # DeMo exchanges its own momentum: no DDP bucket
    elif knobs:
        h, f, delay = knobs
        out["sync.sync_every"] = h
        if method == "streaming_diloco":
            out["sync.fragments"], out["sync.fragment_sync_delay"] = f, delay
    elif d < 1.0:
        out["comm.density"], out["comm.density_schedule"] = d, []
    out["comm.bucket_cap_mb"] = b
    return out


# -- records --------------------------------------------------------------------------------


def job_of(rec: Mapping[str, Any]) -> Job | None:
    """The job a record ran, from its ``protocol`` field and seed; None if not a protocol run."""
    p = rec.get("protocol") or {}
    if not p.get("role"):
        return None
    seed = ((rec.get("config") or {}).get("train") or {}).get("seed")
    return Job(str(p["role"]), method_of(rec), str(p.get("trial")), int(seed or 0))


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


def unpriced(plan: Plan) -> str:
    """One line naming ``plan``'s methods the step-time model cannot price ('' for none)."""
    left = [c for c in plan.comms if c in UNPRICED] if plan.v2() else []
    if not left:
        return ""
    return (
        f"not priced by the step-time model yet: {', '.join(left)}; their trials are "
        f"selected on their measured time on the {plan.cluster} cluster, the same at every "
        f"ratio, and they have no timing-pass runs"
    )


def status(plan: Plan, records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Where the sweep stands, one line per stage (``--status``, ``--aggregate``)."""
    tune = plan.tune_jobs()
    lines = [progress("tuning", [j.key for j in tune], records, _key)] if tune else []
    timing = plan.timing_jobs()
    if timing:
        lines.append(progress("timing pass", [j.key for j in timing], records, _key))
    if not tuning_complete(plan, records):
        n = len(plan.comms) * len(plan.eval_seeds)  # v2: one more set per other selection
        count = f"at least {n} runs" if plan.v2() else f"0 of {n} recorded"
        return [*lines, f"evaluation: {count}, submitted once tuning is recorded"]
    ev = plan.eval_jobs(chosen(plan, records))
    return [*lines, progress("evaluation", [j.key for j in ev], records, _key)]


# wall seconds per run on the 2-core machine, v2 (evaluations from 40 % of dense's steps,
# strided).  Image: measured on 2026-12-03 with a --quick sweep, tuning runs a median 21 s,
# timing runs 8 s, evaluation runs on the emulated cluster 18-41 s.  Translation: the v1
# runs' 50 s of training alone plus about 4 decodings of 2.5 s and the start (its --quick
# tuning runs took 119-186 s with a second job on the 2 cores); a missed run trains 2.5x
# longer, which the tuning runs' figure allows for
RUN_S = {
    "classification": {TUNE: 21.0, TIME: 9.0, "local": 21.0, "check": 30.0},
    "translation": {TUNE: 70.0, TIME: 20.0, "local": 60.0, "check": 75.0},
}


def estimate(plan: Plan) -> tuple[int, int, float, float]:
    """(fewest runs, most runs, fewest minutes, most minutes) of ``plan`` on the 2-core
    machine: its tuning and timing runs, and between one configuration per method (every
    cluster selects the same) and one per method and cluster on each evaluation seed."""
    s = RUN_S[plan.workload()]
    tune, timing = len(plan.tune_jobs()), len(plan.timing_jobs())
    k = len(clusters(plan)) if plan.v2() else 1
    n, seeds = len(plan.comms), len(plan.eval_seeds)
    fixed = tune * s[TUNE] + timing * s[TIME]
    low = fixed + n * seeds * s["check"]
    high = fixed + n * seeds * (s["check"] + (k - 1) * s["local"])
    runs = tune + timing
    return runs + n * seeds, runs + n * seeds * k, low / 60, high / 60


def chosen(plan: Plan, records: Sequence[Mapping[str, Any]]) -> Any:
    """The selection: v1 per method, v2 per cluster and method."""
    if plan.v2():
        return select_per_cluster(selection_table(plan, records))
    return select(tuning_table(plan, records))


def complete(plan: Plan, records: Sequence[Mapping[str, Any]]) -> bool:
    """Every tuning and evaluation job recorded."""
    if not tuning_complete(plan, records):
        return False
    return not pending(plan.eval_jobs(chosen(plan, records)), records)


def _row_head(plan: Plan, comm: str, trial: str, order: int, values: Mapping[str, Any]) -> dict:
    """The columns that name a trial in a tuning table."""
    return {
        "sweep_id": plan.sweep_id,
        "protocol": plan.name,
        "comm": comm,
        "trial": trial,
        "order": order,
        "overrides": " ".join(f"{k}={_value(v)}" for k, v in values.items()),
    }


def tuning_table(plan: Plan, records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per (method, trial): its tuning runs, their median time to target with
    misses at the budget, and whether the rule selects it (:func:`select`)."""
    runs = [r for r in recorded(records).values() if (r.get("protocol") or {}).get("role") == TUNE]
    budget = budget_s(runs)
    rows = []
    for comm in plan.comms:
        trials = plan._space(comm)
        for order, (trial, values) in enumerate(trials):
            mine = [r for r in runs if method_of(r) == comm and r["protocol"]["trial"] == trial]
            times = [censored_time(r, budget) for r in mine]
            rows.append(
                {
                    **_row_head(plan, comm, trial, order, values),
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
    """Every tuning and timing run recorded, none in ``error``: the selection's data whole."""
    return not pending([*plan.tune_jobs(), *plan.timing_jobs()], records, RERUN_FAILED)


# -- v2: selection per cluster, on the tuning seeds, from steps and step times -------------


def clusters(plan: Plan) -> dict[str, float | None]:
    """v2's clusters a number is quoted for: the check cluster (None: its timing pass) and
    the paper's cluster at each named ratio (``paper-fp16`` is ``paper``'s point)."""
    from bench.sweeps.ratios import named_ratios

    named = {k: v for k, v in named_ratios().items() if k != "paper-fp16"}
    return {plan.check_cluster: None, **dict(sorted(named.items(), key=lambda kv: kv[1]))}


def step_times(records: Sequence[Mapping[str, Any]]) -> dict[TimingKey, float]:
    """Timing key -> the median time per step of the timing pass's runs of it on the
    check cluster (s): training time over steps run, the sync strategies' outer
    all-reduces included (their runs are whole periods)."""
    got: dict[TimingKey, list[float]] = {}
    for r in recorded(records).values():
        if (r.get("protocol") or {}).get("role") != TIME or r.get("status") not in (
            "ok",
            "target_missed",
        ):
            continue
        key = _timing_key(str(r["protocol"]["trial"]))
        steps = _steps_run(r)
        t = (r.get("train_time_s") or 0) / steps if steps else r.get("step_time_s")
        if t:
            got.setdefault(key, []).append(float(t))
    return {k: statistics.median(v) for k, v in got.items()}


def _steps_run(rec: Mapping[str, Any]) -> int:
    """The optimizer steps a run took (its phase log, else its epochs' step counts)."""
    n = sum(int(p.get("steps", 0)) for p in rec.get("comm_phases") or [])
    if n:
        return n
    cfg = (rec.get("config") or {}).get("train") or {}
    per, epochs = int(cfg.get("max_steps_per_epoch") or 0), int(rec.get("epochs_run") or 0)
    return per * epochs


def cluster_time(
    run: Any, bucket: float, ratio: float | None, times: Mapping[tuple, float]
) -> float:
    """A run's time to target (its whole run, missed) on one cluster: its logged steps x
    the model's time per step at ``ratio``, or (None) the timing pass's of each phase."""
    from bench.sweeps.ratios import run_time_s

    if ratio is not None:
        return run_time_s(run, ratio)
    total = 0.0
    for p in run.phases:
        key = (
            bucket,
            p.method,
            1.0 if p.method == "powersgd" else p.density,
            p.rank if p.method == "powersgd" else 0,
            p.knobs,
        )
        if key not in times:
            return math.nan
        total += p.steps * times[key]
    return total


def selection_table(plan: Plan, records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """v2's tuning table: per (method, trial, cluster) the median over the tuning seeds of
    the time to target there (steps x step time; a miss: its whole run), the median steps,
    what the runs sent, and whether the rule selects it for that cluster."""
    from bench.results.records import load_curve
    from bench.sweeps.ratios import run_from_record

    runs = [r for r in recorded(records).values() if (r.get("protocol") or {}).get("role") == TUNE]
    times = step_times(records)
    where = clusters(plan)
    rows = []
    for comm in plan.comms:
        for order, (trial, values) in enumerate(plan._space(comm)):
            mine = [r for r in runs if method_of(r) == comm and r["protocol"]["trial"] == trial]
            done = []
            for r in mine:
                try:
                    run = run_from_record(r, load_curve(plan.results_dir, str(r["run_id"])))
                except FileNotFoundError:
                    run = None
                if run is not None:
                    done.append((r, run))
            bucket = float(values.get("comm.bucket_cap_mb", 25.0))
            for cluster, ratio in where.items():
                if comm in UNPRICED:  # its measured time on the plan's cluster, everywhere
                    ts = [censored_time(r, budget_s(runs)) for r in mine]
                else:
                    ts = [cluster_time(run, bucket, ratio, times) for _, run in done]
                rows.append(
                    {
                        **_row_head(plan, comm, trial, order, values),
                        "cluster": cluster,
                        "ratio": math.nan if ratio is None else ratio,
                        "n_runs": len(mine),
                        "n_reached": sum(run.reached for _, run in done),
                        "median_steps": statistics.median([run.steps for _, run in done])
                        if done
                        else math.nan,
                        "median_time_s": statistics.median(ts) if ts else math.nan,
                        "ran": " | ".join(
                            sorted({ran([p.__dict__ for p in run.phases]) for _, run in done})
                        ),
                        "seeds": " ".join(str(job_of(r).seed) for r, _ in done),  # type: ignore[union-attr]
                        "run_ids": " ".join(str(r["run_id"]) for r in mine),
                    }
                )
    df = pd.DataFrame(rows)
    df["selected"] = False
    for cluster, chosen in select_per_cluster(df).items():
        for comm, trial in chosen.items():
            hit = (df["cluster"] == cluster) & (df["comm"] == comm) & (df["trial"] == trial)
            df.loc[hit, "selected"] = True
    return df


def select_per_cluster(table: pd.DataFrame) -> dict[str, dict[str, str]]:
    """The rule, fixed before the sweep: per cluster and method, the trial of lowest
    median time to target on the tuning seeds (:func:`selection_table`); ties, and no
    time at all, go to the trial declared first."""
    return {str(cluster): select(g) for cluster, g in table.groupby("cluster", sort=False)}


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
    todo = pending(plan.timing_jobs(), recs, rerun)
    if todo:  # v2: the interleaved timing pass on the check cluster
        log(f"timing pass: {len(todo)} of {len(plan.timing_jobs())} runs to go")
        rcs += runner([plan.overrides(j) for j in todo], sweep_dir / TIME, plan.experiment)
        recs = sweep_records(plan.results_dir, plan.sweep_id)
    tuning = selection_table(plan, recs) if plan.v2() else tuning_table(plan, recs)
    path = Path(plan.results_dir) / "ablation" / f"{plan.sweep_id}-tuning.csv"
    write(tuning, path)  # partial (``write`` decides) while runs are missing or failed
    if not tuning_complete(plan, recs):  # a selection on missing data is no selection
        jobs = [*plan.tune_jobs(), *plan.timing_jobs()]
        left = pending(jobs, recs, RERUN_FAILED)
        failed = sum(j.key in recorded(recs) for j in left)  # recorded, in error
        again = f"--resume {plan.sweep_id}" + (" --rerun-failed" if failed else "")
        raise ConfigError(
            f"{len(left)} of {len(jobs)} tuning and timing runs are missing ({failed} ended in "
            f"error), so no configuration was selected and no evaluation submitted; {again} "
            "runs them"
        )
    picked = select_per_cluster(tuning) if plan.v2() else select(tuning)
    log(f"selected: {picked} ({path})")
    todo = pending(plan.eval_jobs(picked), recs, rerun)
    if todo:
        log(f"evaluation: {len(todo)} of {len(plan.eval_jobs(picked))} runs to go")
        rcs += runner([plan.overrides(j) for j in todo], sweep_dir / EVAL, plan.experiment)
    return rcs
