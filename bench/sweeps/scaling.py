"""Scaling: step time and efficiency (compute-only step / step) against nodes on emulated
clusters of 1 to 8 nodes, each size predicted by the model before it runs; per size one
launch runs a warm-up, a compute-only calibration, then ``repeats`` rotated rounds of every
method (docs/internals/sweeps.md)."""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from bench import methods
from bench.config import hydra_value, to_object
from bench.launch import profile
from bench.methods import Knobs
from bench.registry import ConfigError
from bench.sweeps import resume
from bench.sweeps import scaling_model as sm
from bench.sweeps.common import (
    check_names,
    compose,
    compose_all,
    options,
    quick_methods,
    sweep_records,
    validate_jobs,
)
from bench.sweeps.resume import RERUN_FAILED, RUN_FIELDS, Saved, plan_dict

COMMS = methods.defaults()  # every default method, the sync strategies and DeMo included
TOPOLOGIES = "1x1,2x1,2x2,4x1,4x2,8x1"  # one worker per node, and 2 per node
# 2 rounds: the least that gives an interval
QUICK = {"cluster": "local", "comms": ",".join(quick_methods()), "topologies": "1x1,2x1",
         "steps": 2, "repeats": 2}  # fmt: skip
# a run's seed names its role in the table: round r of the methods and the reference runs
# with SEED + r, a size's warm-up with SEED - 2 and its calibration with SEED - 1 (never a
# protocol seed)
SEED = 3000
WARMUP_SEED, CALIBRATION_SEED = SEED - 2, SEED - 1
# a sweep's wall time beyond its runs' own, per size (profile, predictions, launch): 45-60 s
# in the sweeps of 2026-12-01/05 on 2 cores
SIZE_OVERHEAD_S = 55.0
Point = tuple[int, int, str, int]  # nodes, workers per node, method, seed


def parse_topologies(text: str) -> list[tuple[int, int]]:
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        try:
            n, m = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise ConfigError(f"topology {item!r} is not NODESxWORKERS, e.g. 2x1") from None
        if n < 1 or m < 1:
            raise ConfigError(f"topology {item!r}: nodes and workers must be >= 1")
        if (n, m) in out:
            raise ConfigError(f"topology {item!r} is given twice")
        out.append((n, m))
    if not out:
        raise ConfigError("no topology given (e.g. --topologies 1x1,2x1,4x1)")
    return sorted(out, key=lambda t: (t[0] * t[1], t))


@dataclass
class Plan(Saved):
    """One scaling sweep; saved with its profiles and predictions before its first run."""

    FOLDER, WHAT = "scaling", "scaling"
    sweep_id: str
    experiment: str = "dawnbench_digits"
    cluster: str = "emulated"  # the cluster of the sizes with 2 nodes or more
    comms: Sequence[str] = COMMS
    topologies: Sequence[tuple[int, int]] = ((1, 1), (2, 1), (2, 2), (4, 1), (4, 2), (8, 1))
    # steps per epoch: the digits' batches per epoch at 8 workers of 32, and half the sync
    # strategies' period of 10, so that their runs measure whole periods in 2 epochs
    steps: int = 5
    epochs: int = 3  # the first is warm-up (a sync strategy's: see schedule)
    batch_per_worker: int = 32
    repeats: int = 3  # rounds: runs of every (size, method), the interval's sample
    results_dir: str = "runs"
    link: Sequence[str] = ()  # the profile overrides of the shaped sizes (cluster_profile)
    extra: Sequence[str] = ()
    pinned: dict[str, list[str]] = field(default_factory=dict)  # "NxM" -> its profile's pin
    launcher: str = ""  # "" = the run queue here, else a Hydra launcher
    launcher_overrides: Sequence[str] = ()

    def check(self) -> None:
        check_names("experiment", [self.experiment], options("experiment"))
        check_names("cluster", [self.cluster], options("cluster"))
        known = [s.name for s in methods.specs() if s.kind != "reference"]
        check_names("comm", list(self.comms), known)
        if self.steps < 1 or self.batch_per_worker < 1:
            raise ConfigError("--steps and --batch-per-worker must be >= 1")
        if self.epochs < 2:
            raise ConfigError(f"--epochs must be >= 2 (the first is warm-up), got {self.epochs}")
        if self.repeats < 1:
            raise ConfigError(f"--repeats must be >= 1 (2 or more give an interval), "
                              f"got {self.repeats}")  # fmt: skip
        if (1, 1) not in self.topologies:
            raise ConfigError("the topologies must include 1x1, the reference of throughput")
        # one job per (size, method): the rounds differ in their seed alone
        once = {p[:3]: job for p, job in self.jobs()}
        validate_jobs(list(once.values()), self.results_dir)

    def cluster_of(self, nodes: int) -> str:
        return "local" if nodes == 1 and self.cluster == "emulated" else self.cluster

    def methods_at(self, n: int, m: int) -> list[str]:
        """The methods run at size ``n`` x ``m`` (1x1: the warm-up's alone, for all)."""
        run = [sm.WARMUP_COMM] if n * m == 1 else list(self.comms)
        return [c for c in run if n >= methods.get(c).min_nodes]

    def points(self) -> list[Point]:
        """Each run, size by size; round r rotated by r / repeats of its length, so that a
        drift in the machine's speed falls on every method alike."""
        out: list[Point] = []
        for n, m in self.topologies:
            out += [(n, m, sm.WARMUP_COMM, WARMUP_SEED)] * sm.WARMUP_RUNS
            out += [(n, m, sm.NOCOMM, CALIBRATION_SEED)] * sm.CALIBRATION_RUNS
            run = [*self.methods_at(n, m), sm.NOCOMM]
            for r in range(self.repeats):
                at = r * len(run) // self.repeats
                out += [(n, m, c, SEED + r) for c in run[at:] + run[:at]]
        return out

    def skipped(self) -> list[str]:
        out = []
        for (n, m), c in ((t, c) for t in self.topologies for c in self.comms):
            if n * m == 1 and c != sm.WARMUP_COMM:
                out.append(
                    f"{c} on 1x1: one worker sends nothing ({sm.WARMUP_COMM} stands for all)"
                )
            elif n < methods.get(c).min_nodes:
                out.append(f"{c} on {n}x{m}: needs >= {methods.get(c).min_nodes} nodes")
        return out

    def schedule(self, comm: str) -> tuple[int, int]:
        return schedule(self.period_of(comm), self.steps, self.epochs - 1)

    def schedules(self) -> list[str]:
        by: dict[tuple[int, int], list[str]] = {}
        for c in self.comms:
            by.setdefault(self.schedule(c), []).append(c)
        return [
            f"{', '.join(cs)}: {w} warm-up epoch(s) then {k} measured, of {self.steps} steps"
            + (f" (whole periods of {self.period_of(cs[0])} steps)" if self.period_of(cs[0]) > 1
               else "")
            for (w, k), cs in by.items()
        ]  # fmt: skip

    def period_of(self, comm: str) -> int:
        if comm == sm.NOCOMM:
            return 1
        sig = (tuple(self.comms), tuple(self.extra), self.experiment)
        if self.__dict__.get("_knobs", (None,))[0] != sig:  # every method's config: once
            self.__dict__["_knobs"] = (sig, self.knobs())
        spec = methods.get(comm)
        return spec.period(self.__dict__["_knobs"][1].get(comm) or spec.knobs_of({}))

    def size_overrides(self, n: int, m: int, epochs: int = 0) -> list[str]:
        cl, epochs = self.cluster_of(n), epochs or self.epochs
        return [
            f"experiment={self.experiment}", f"cluster={cl}", f"cluster.nnodes={n}",
            f"cluster.nproc_per_node={m}", f"data.batch_size={self.batch_per_worker * n * m}",
            f"train.epochs={epochs}", f"train.max_steps_per_epoch={self.steps}",
            f"train.eval_every={epochs}", "train.stop_at_target=false",
            "train.checkpoint_every=0", "train.progress=false", "results.plot=false",
            f"results.dir={hydra_value(self.results_dir)}", f"results.sweep_id={self.sweep_id}",
            *(self.link if cl == "emulated" else ()), *self.extra,
            *self.pinned.get(f"{n}x{m}", []),
        ]  # fmt: skip

    def jobs(self) -> list[tuple[Point, list[str]]]:
        out = []
        for p in self.points():
            n, m, c, seed = p
            epochs = sum(self.schedule(c))
            over = [*self.size_overrides(n, m, epochs), f"train.seed={seed}"]
            out.append((p, [*over, *methods.get(c).overrides()]))
        return out

    def pending(self, records: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Indices of the runs without a finished record (a failed run measured nothing)."""
        if records is None:
            records = sweep_records(self.results_dir, self.sweep_id)
        return resume.pending(self.points(), records, key_of, RERUN_FAILED)

    def progress(self, records: Sequence[Mapping[str, Any]]) -> str:
        points, todo = set(self.points()), len(self.pending(records))
        by = Counter(str(r.get("status")) for r in records if key_of(r) in points)
        total = len(self.points())
        how = ", ".join(f"{n} {s}" for s, n in sorted(by.items()))
        return f"scaling: {total - todo} of {total} runs done, {todo} to go" + (
            f" (records: {how})" if how else ""
        )

    def run(self, sweep_dir: str | Path, runner: Callable[..., list[int]]) -> list[int]:
        jobs = self.jobs()
        return runner([jobs[i][1] for i in self.pending()], sweep_dir, self.experiment)

    def expected(self, walls: Mapping[tuple, list[float]]) -> tuple[float, int]:
        """(s, runs counted): the runs to go at the median wall time per step of earlier
        runs (``walls``, per size and method, else per size), plus SIZE_OVERHEAD_S a size."""
        jobs, total, counted, sizes = self.jobs(), 0.0, 0, set()
        for i in self.pending():
            n, m, c, _ = jobs[i][0]
            sizes.add((n, m))
            per = walls.get((n, m, c)) or walls.get((n, m))
            if per:
                total += statistics.median(per) * self.steps * sum(self.schedule(c))
                counted += 1
        return total + SIZE_OVERHEAD_S * len(sizes), counted

    def prepare(self) -> dict[str, Any]:
        """Time and pin each size's compute, calibrate the model and predict every run: the
        plan the sweep writes before its first run."""
        sizes = []
        for n, m in self.topologies:
            over = [*self.size_overrides(n, m), f"comm={sm.NOCOMM}"]
            cfg = to_object(compose(over))
            # the size's workers computing at once: the profile's compute
            together = sm.concurrent_step_s(over, n, m)
            if cfg.cluster.profile is not None:
                cfg.cluster.profile_compute_s = together
            prof = profile.apply(cfg)  # None without a profile
            step = prof if prof is not None else {"compute_s": together}
            if prof is not None:
                self.pinned[f"{n}x{m}"] = [f"cluster.profile_compute_s={prof['compute_s']:.6g}"]
            link = prof["inter_node_bandwidth"] if prof else None
            if link is None and self.cluster_of(n) == "emulated":
                link = cfg.cluster.inter_node_bandwidth
            sizes.append(
                {
                    "nodes": n,
                    "workers_per_node": m,
                    "cluster": self.cluster_of(n),
                    "compute_s": float(step["compute_s"]),
                    "compute_how": f"{n * m} worker(s) at once, loader, forward, backward "
                    f"and update, median of {sm.CONCURRENT_STEPS} steps of the slowest",
                    "update_included": True,
                    "target_ratio": prof["target_ratio"] if prof else None,
                    "inter_node_bandwidth": link,
                    "profile": profile.describe(prof) if prof else "no shaped link",
                }
            )
        cfg = to_object(compose([*self.size_overrides(1, 1), f"comm={sm.NOCOMM}"]))
        knobs = self.knobs()
        own = {c: k for c, k in knobs.items() if methods.get(c).kind == "optimizer"}
        cal, numel = _calibrate(cfg, own)
        return {
            "sweep_id": self.sweep_id, "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "experiment": self.experiment, "batch_per_worker": self.batch_per_worker,
            "steps": self.steps, "epochs": self.epochs, "repeats": self.repeats,
            "schedule": {c: self.schedule(c) for c in [*self.comms, sm.NOCOMM]},
            "numel": numel, "calibration": cal.to_dict(), "assumed": dict(sm.ASSUMED),
            "sizes": sizes, "knobs": {c: k.overrides() for c, k in knobs.items()},
            "predictions": self.predict(sizes, cal, knobs),
        }  # fmt: skip

    def knobs(self) -> dict[str, Knobs]:
        """Each method's knobs as its runs are configured, typed by its spec."""
        n = {c: max(2, methods.get(c).min_nodes) for c in self.comms}
        cfgs = compose_all(
            [[*self.size_overrides(n[c], 1), *methods.get(c).overrides()] for c in self.comms]
        )
        return {
            c: methods.get(c).knobs_of(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
            for c, cfg in zip(self.comms, cfgs, strict=True)
        }

    def predict(
        self, sizes: list[dict[str, Any]], cal: sm.Calibration, knobs: dict[str, Knobs]
    ) -> list[dict]:
        from bench.cluster.netns import parse_bandwidth

        by = {(s["nodes"], s["workers_per_node"]): s for s in sizes}
        out = []
        for n, m, comm in dict.fromkeys(p[:3] for p in self.points()):
            s = by[(n, m)]
            bw = s["inter_node_bandwidth"]
            link_bps = parse_bandwidth(bw) if bw and n > 1 else None
            k = knobs.get(comm) or methods.get(comm).knobs_of({})
            p = sm.predict(comm, n, m, s["compute_s"], link_bps, cal, k,
                           update_included=bool(s.get("update_included")))  # fmt: skip
            density = float(getattr(k, "density", 1.0))
            out.append({"nodes": n, "workers_per_node": m, "comm": comm,
                        "density": density, **p})  # fmt: skip
        return out


def _calibrate(cfg: Any, own: dict[str, Knobs]) -> tuple[sm.Calibration, int]:
    """The model's micro-measurements on ``cfg``'s model (built as a worker builds it)."""
    import torch

    from bench.train.workload import WORKLOADS

    torch.manual_seed(cfg.train.seed)
    wl = WORKLOADS.get(cfg.train.workload)(cfg, 0, 1, torch.device("cpu"))
    numel = sum(p.numel() for p in wl.model.parameters() if p.requires_grad)
    cal = sm.calibrate(wl.model, float(cfg.comm.density), float(cfg.comm.bucket_cap_mb), own)
    return cal, numel


def schedule(period: int, steps: int, measured: int) -> tuple[int, int]:
    """(warm-up epochs, measured epochs) of ``steps`` steps each for a method exchanging
    every ``period`` steps: a warm-up of a whole period, then the fewest epochs, at least
    ``measured``, that hold whole periods (its outer synchronisation amortised)."""
    if period <= 1:
        return 1, measured
    whole = period // math.gcd(period, steps)  # epochs in which the periods come out even
    return -(-period // steps), whole * -(-measured // whole)


def key_of(rec: Mapping[str, Any]) -> Point | None:
    """A scaling run's (nodes, workers per node, method, seed), as :meth:`Plan.points`."""
    cfg = rec.get("config") or {}
    cl = cfg.get("cluster") or {}
    if rec.get("comm") is None:
        return None
    seed = int((cfg.get("train") or {}).get("seed", 0))
    return (int(cl.get("nnodes", 1)), int(cl.get("nproc_per_node", 1)),
            methods.method_of(rec), seed)  # fmt: skip


def plan_path(results_dir: str | Path, sweep_id: str) -> Path:
    return Path(results_dir) / "scaling" / f"{sweep_id}.plan.json"


def write_plan(plan: dict[str, Any], results_dir: str | Path, fields: Plan | None = None) -> Path:
    """The plan, before the first run; with ``fields``, that sweep's own beside it."""
    path = plan_path(results_dir, plan["sweep_id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        raise ConfigError(f"{path} exists; a sweep's plan is never replaced")
    doc = {**plan, **(plan_dict(fields) if fields is not None else {})}
    path.write_text(json.dumps(doc, indent=1))
    return path


COMPARE_SKIP = (*RUN_FIELDS, "pinned")  # how a sweep runs, and what its first start timed


def check_same(fresh: Plan, saved: Mapping[str, Any]) -> None:
    """ConfigError unless ``fresh`` is the plan saved (but ``COMPARE_SKIP``)."""
    d = plan_dict(fresh)
    diff = sorted(k for k in d if k not in COMPARE_SKIP and d[k] != saved.get(k))
    if diff:
        raise ConfigError(
            f"{plan_path(fresh.results_dir, fresh.sweep_id)} exists with another plan "
            f"(differs in {', '.join(diff)}); it is not replaced: rerun the command it was "
            "made by, or give a new sweep id"
        )


def load(results_dir: str | Path, sweep_id: str) -> tuple[Plan, dict[str, Any]]:
    doc = read_plan(results_dir, sweep_id)
    return Plan.load(results_dir, sweep_id), doc


def read_plan(results_dir: str | Path, sweep_id: str) -> dict[str, Any]:
    """The plan's saved document; one made before rounds were is refused."""
    path = plan_path(results_dir, sweep_id)
    if not path.is_file():
        raise ConfigError(f"no plan for sweep {sweep_id!r} at {path}")
    doc = json.loads(path.read_text())
    if "repeats" not in doc:
        raise ConfigError(
            f"{path} was made before --repeats (its runs are not tagged by round): its "
            f"table is {Path(results_dir) / 'scaling' / sweep_id}.csv as that sweep wrote it"
        )
    return doc
