"""``python -m reproduce ablation [options] [overrides]``

By default the tuning protocol (:mod:`bench.sweeps.protocol`, docs/protocol.md): every
method's search space tuned on tuning seeds with the same number of trials, the
configuration chosen by a rule fixed in advance, then 10 fresh evaluation seeds per method,
one table with 95 % intervals.  ``--grid``: time to target over communication x cache x
update mode x seeds, one table (``bench/sweeps/ablation.py`` says what each column is).
Each job is an ordinary training run tagged with the sweep id (a failed job does not stop
the others), trained through a run queue (the workers launched once, not once per run);
the table goes to ``<results-dir>/ablation/<sweep_id>.csv``.  Trailing ``key=value``
overrides apply to every job.

``--launcher slurm`` (or ``hydra/launcher=...``; ``submitit_local`` on one machine): each
job its own Hydra multirun job through hydra-submitit-launcher (``bench/launch/submit.py``);
the protocol submits its evaluation runs once the tuning runs are recorded.  ``--sweep-id
ID`` names a sweep so that the same command again resumes it (``--resume ID`` too: only the
jobs without a record, or interrupted, run), ``--status ID`` says what is recorded and what
is not, ``--aggregate ID`` builds the table from whatever is recorded (under
``ablation/partial/`` while jobs are missing).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from reproduce import _sweep
from reproduce._cli import RESULTS, Parser, fail

USAGE = """ablation [--workload W | --experiment E] [--cluster C] [--seeds N] [--comm a,b]
           [--measured P,Q | none] [--quick] [--grid] [--dry-run] [--launcher slurm] [--sweep-id ID]
           [--resume ID] [--status ID] [--aggregate ID]
                          the tuning protocol (tune, select, 10 evaluation seeds; --grid:
                          comm x cache x update x seeds), one table in
                          runs/ablation/<sweep_id>.csv; --launcher: each job a Slurm job"""


def _parser() -> argparse.ArgumentParser:
    from bench.methods import defaults
    from bench.sweeps.common import quick_methods
    from bench.sweeps.protocol import MEASURED

    ap = Parser(
        "ablation",
        summary="The comparison the suite exists for: every communication method tuned with "
        "the same budget on tuning seeds, the chosen configuration evaluated on 10 fresh "
        "seeds, time to target with 95 % intervals against dense and the best peer "
        f"({RESULTS}/ablation/<sweep_id>.csv by default); --grid runs the older "
        "comm x cache x update x seeds grid instead.",
        example="python -m reproduce ablation --quick --cluster local --dry-run",
        details=__doc__,
    )
    ap.add_argument("--experiment", default="", help="conf/experiment/<E>.yaml")
    ap.add_argument("--workload", default="", help="image | translation (the protocol's)")
    ap.add_argument("--cluster", default="", help="local | emulated | multinode (default "
                    "emulated; multinode on Slurm, local with submitit_local)")  # fmt: skip
    ap.add_argument("--seeds", type=int, default=None, help="evaluation seeds (protocol: 10) "
                    "or seeds per configuration (--grid: 3)")  # fmt: skip
    ap.add_argument("--comm", default="",
                    help=f"comma-separated methods (default: {','.join(defaults())})")  # fmt: skip
    ap.add_argument("--measured", default="", help="protocol: the named profiles an emulated "
                    f"2 x 2 is shaped to and measured at (default {','.join(MEASURED)}; none "
                    "with --quick on the local cluster or on multinode), or none (no root "
                    "needed)")  # fmt: skip
    ap.add_argument("--cache", default="", help="--grid: comma-separated (none,multilevel)")
    ap.add_argument("--update", default="", help="--grid: comma-separated (naive,flat)")
    ap.add_argument("--quick", action="store_true",
                    help=f"a smoke test, not the protocol: {' and '.join(quick_methods())}, "
                    "1 tuning and 1 evaluation seed, one knob setting at 3 rates each")  # fmt: skip
    ap.add_argument("--grid", action="store_true", help="the comm x cache x update grid")
    ap.add_argument("--order-seed", type=int, default=None, help="protocol: run order seed")
    ap.add_argument("--until", choices=("tuning",), default="",
                    help="protocol: stop once the tuning runs are recorded (they count steps, "
                    "so a busy machine does not change them); --resume runs the rest")  # fmt: skip
    ap.add_argument("--dry-run", action="store_true", help="check and summarise, run nothing")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="with --dry-run: every job's command line, each job checked")  # fmt: skip
    ap.add_argument("--aggregate", metavar="SWEEP_ID", help="rebuild the table from records")
    _sweep.add_options(ap)
    ap.add_argument(
        "--keep-out",
        action="store_true",
        help="with --resume on another CPU kind than the sweep's measured runs: run its "
        "evaluation runs left here; they count where only steps count (the projections), "
        "are kept out of the measured columns, which say so, and are not run again",
    )
    ap.add_argument(
        "--results-dir",
        metavar="DIR",
        default=RESULTS,
        help=f"where the jobs' records and the table go (default {RESULTS}/, git-ignored)",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every job")
    return ap


def _experiment(args: argparse.Namespace) -> str:
    from bench.registry import ConfigError
    from bench.sweeps.protocol import WORKLOADS

    if args.workload and args.experiment:
        raise ConfigError("give --workload or --experiment, not both")
    if args.workload:
        return WORKLOADS[_workload_name(args)]
    return args.experiment or "dawnbench_digits"


def _workload_name(args: argparse.Namespace) -> str:
    """The protocol workload whose defaults apply (``image`` for any other experiment)."""
    from bench.sweeps.protocol import WORKLOADS

    if args.workload:
        if args.workload not in WORKLOADS:
            from bench.registry import ConfigError
            from reproduce._cli import did_you_mean

            known = ", ".join(WORKLOADS)
            hint = did_you_mean(args.workload, WORKLOADS)
            raise ConfigError(f"unknown workload {args.workload!r}; known: {known}{hint}")
        return args.workload
    return next((w for w, e in WORKLOADS.items() if e == args.experiment), "image")


def _kind(results_dir: str, sweep_id: str) -> str:
    d = Path(results_dir) / "ablation"
    if (d / f"{sweep_id}.plan.json").exists():
        return "protocol"
    return "grid" if (d / f"{sweep_id}.grid.json").exists() else ""


def _load(results_dir: str, sweep_id: str):
    from bench.registry import ConfigError
    from bench.sweeps import ablation as ab
    from bench.sweeps import protocol as pr

    kind = _kind(results_dir, sweep_id)
    if not kind:
        raise ConfigError(f"no plan of sweep {sweep_id} in {results_dir}/ablation/")
    return (pr.Plan if kind == "protocol" else ab.Plan).load(results_dir, sweep_id)


def _protocol_plan(args: argparse.Namespace, jobs: list[str]):
    import random

    from bench import methods
    from bench.registry import ConfigError
    from bench.sweeps import protocol as pr
    from bench.sweeps.common import cluster_profile, new_sweep_id, split_list

    if args.cache or args.update:
        raise ConfigError("--cache and --update narrow the --grid sweep only")
    quick = pr.quick() if args.quick else {}
    n = args.seeds if args.seeds is not None else len(quick.get("eval_seeds", pr.EVAL_SEEDS))
    if n < 1:
        raise ConfigError(f"--seeds must be >= 1, got {n}")
    order_seed = args.order_seed if args.order_seed is not None else random.randrange(10**6)
    plan = pr.Plan(
        sweep_id=args.sweep_id or new_sweep_id("ablation"),
        experiment=_experiment(args),
        cluster=args.cluster,
        comms=split_list(args.comm) or quick.get("comms") or methods.defaults(),
        tune_seeds=quick.get("tune_seeds", pr.TUNE_SEEDS),
        eval_seeds=tuple(range(n)),
        trials=quick.get("trials"),
        order_seed=order_seed,
        results_dir=args.results_dir,
        extra=jobs,
        measured=_measured(args),
    )
    plan.check()
    plan.notes.append(
        f"protocol {plan.name}: tuning seeds {list(plan.tune_seeds)}, evaluation seeds "
        f"{list(plan.eval_seeds)}, run order seed {plan.order_seed}, evaluation every "
        f"{plan.every()} steps"
    )
    plan.cluster_overrides, note = cluster_profile(args.cluster, jobs)
    plan.notes.append(note)
    if n < pr.MIN_EVAL_SEEDS and not args.quick:
        plan.notes.append(f"{n} evaluation seeds: the protocol asks for at least 10")
    if plan.measured:
        from bench.sweeps.measured import MAX_ROUNDS, TOLERANCE

        each = ", ".join(f"{c} ({p}, {r:.2f})" for c, (p, r) in pr.measured_clusters(plan).items())
        plan.notes.append(
            f"measured clusters {each}: an emulated 2 x 2 whose link is shaped until dense's "
            f"measured comm / compute is within {TOLERANCE:.0%} of the ratio (at most "
            f"{MAX_ROUNDS} rounds), then timed and evaluated on it"
        )
    else:
        plan.notes.append("no measured cluster: each cluster's number is the model's projection")
    if args.quick:
        plan.notes.append("--quick is a smoke test, not the protocol: 1 tuning seed (the "
                          "protocol's are 2), one knob setting per method")  # fmt: skip
    lo, hi, t_lo, t_hi = pr.estimate(plan)
    plan.notes.append(
        f"{lo}-{hi} runs, about {t_lo:.0f}-{t_hi:.0f} minutes on 2 cores (docs/protocol.md)"
    )
    _check(plan, not args.dry_run or args.verbose)
    return plan


def _measured(args: argparse.Namespace) -> tuple[str, ...]:
    """The profiles an emulated 2 x 2 is shaped to: as given; else none on a real cluster
    or for a quick try on the local cluster (no root needed), the named two otherwise."""
    from bench.sweeps.common import split_list
    from bench.sweeps.protocol import MEASURED

    if args.measured:
        return () if args.measured == "none" else tuple(split_list(args.measured))
    none = args.cluster == "multinode" or (args.quick and args.cluster == "local")
    return () if none else MEASURED


def _check(plan, every: bool) -> None:
    """Every job composed and checked as its run will be; not ``every`` (a dry run
    without --verbose): one job per set of config groups chosen."""
    from bench.sweeps import protocol as pr
    from bench.sweeps.common import validate_jobs

    if every:
        plan.check_jobs()
        return
    if isinstance(plan, pr.Plan):
        jobs = [plan.overrides(pr.Job(pr.TUNE, c, t, 0)) for c in plan.comms
                for t, _ in plan._space(c)]  # fmt: skip
        jobs += [plan.overrides(j) for j in _first_shaping(plan)[:1]]
    else:
        jobs = plan.jobs()
    one = {tuple(o for o in j if "." not in o.split("=", 1)[0]): j for j in reversed(jobs)}
    validate_jobs(list(one.values()), plan.results_dir)


def _grid_plan(args: argparse.Namespace, jobs: list[str]):
    from bench.sweeps import ablation as ab
    from bench.sweeps.common import cluster_profile, new_sweep_id, split_list

    quick = ab.quick() if args.quick else {}
    seeds = args.seeds if args.seeds is not None else 3
    plan = ab.Plan(
        sweep_id=args.sweep_id or new_sweep_id("ablation"),
        experiment=_experiment(args),
        cluster=args.cluster,
        comms=split_list(args.comm) or quick.get("comm") or ab.comms(),
        caches=split_list(args.cache) or quick.get("cache", ab.CACHES),
        updates=split_list(args.update) or quick.get("update", ab.UPDATES),
        seeds=quick.get("seeds", seeds) if args.quick else seeds,
        results_dir=args.results_dir,
        extra=jobs,
    )
    plan.check_names()
    plan.cluster_overrides, note = cluster_profile(args.cluster, jobs)
    plan.notes.append(note)
    _check(plan, not args.dry_run or args.verbose)  # before anything runs
    return plan


def _same(args: argparse.Namespace, jobs: list[str], plan) -> None:
    """The command that made ``plan``, given again: refused when it would make another."""
    from bench.registry import ConfigError
    from bench.sweeps import protocol as pr
    from bench.sweeps.resume import RUN_FIELDS, save_plan

    if args.grid == isinstance(plan, pr.Plan):
        kind = "protocol" if isinstance(plan, pr.Plan) else "grid"
        raise ConfigError(f"sweep {plan.sweep_id} is a {kind} sweep: give --grid only for a grid")
    fresh = (_grid_plan if args.grid else _protocol_plan)(args, jobs)
    chosen = [f for f in pr.START_FIELDS if f != "order_seed" or args.order_seed is None]
    save_plan(fresh, plan.path(), compare_skip=(*RUN_FIELDS, *chosen))


def _first_shaping(plan) -> list:
    """The first shaping round of every measured cluster (its link: the model's guess)."""
    from bench.sweeps.measured import names, shape_jobs

    return [j for n in names(plan) for j in shape_jobs(n, 0)]


def _first_job(plan) -> list[str]:
    from bench.sweeps import protocol as pr

    return plan.overrides(plan.tune_jobs()[0]) if isinstance(plan, pr.Plan) else plan.jobs()[0]


def _plan(args: argparse.Namespace):
    """(the sweep the command names, whether it is resumed): a new one, or the saved one
    with the launcher given now."""
    from bench.sweeps.protocol import WORKLOAD_DEFAULTS

    jobs, hydra, launcher = _sweep.launcher_of(args)
    given = ("workload", "experiment", "cluster", "seeds", "comm", "measured", "cache",
             "update", "quick", "grid", "order_seed")  # fmt: skip
    _sweep.refuse_plan_options(args, _parser(), given, jobs)
    here = "emulated" if args.grid else WORKLOAD_DEFAULTS[_workload_name(args)]["cluster"]
    args.cluster = _sweep.default_cluster(args.cluster, launcher, here)
    sid = args.resume or args.sweep_id
    resumed = bool(sid and (args.resume or _kind(args.results_dir, sid)))
    with _sweep.checking_for(launcher):
        if resumed:
            plan = _load(args.results_dir, sid)
            if not args.resume:
                _same(args, jobs, plan)
            plan.notes.append(f"resuming {sid}: recorded runs are not run again")
        else:
            plan = (_grid_plan if args.grid else _protocol_plan)(args, jobs)
    if args.keep_out:
        _keep_out(plan, resumed)
    _sweep.use_launcher(plan, launcher, hydra)
    _sweep.check_launch(plan, [_first_job(plan)])
    return plan, resumed


def _write(df, results_dir: str, sweep_id: str, complete: bool, lines: list[str]) -> None:
    from bench.sweeps.resume import write_sweep_table

    path, wrote = write_sweep_table(df, results_dir, "ablation", sweep_id, complete)
    partial = path.parent.name == "partial"
    for line in lines if partial else []:
        print(f"missing: {line}", flush=True)
    why = "jobs are missing" if not complete else "error runs; --rerun-failed runs them again"
    print(f"table: {path}" + ("" if wrote else " (unchanged)")
          + (f" (partial: {why})" if partial else ""), flush=True)  # fmt: skip


def _table(results_dir: str, sweep_id: str, plan=None) -> None:
    """The grid's table; with its plan, what is missing."""
    from bench.sweeps.ablation import aggregate, format_table, key_of
    from bench.sweeps.common import sweep_records
    from bench.sweeps.resume import progress

    recs = sweep_records(results_dir, sweep_id)
    if not recs:
        fail(f"no records tagged results.sweep_id={sweep_id} in {results_dir}/runs.jsonl")
    df = aggregate(recs, sweep_id)
    print(format_table(df))
    lines = [progress("grid", plan.keys(), recs, key_of)] if plan else []
    _write(df, results_dir, sweep_id, plan is None or not plan.pending(), lines)


def _protocol_table(results_dir: str, plan) -> None:
    from bench.sweeps import carryover as co
    from bench.sweeps import measured
    from bench.sweeps import protocol as pr
    from bench.sweeps import protocol_table as pt
    from bench.sweeps.common import sweep_records
    from bench.sweeps.resume import write_sweep_table

    every = sweep_records(results_dir, plan.sweep_id)
    # a measured run on another CPU kind: in no table, but an evaluation run kept out
    recs = measured.counted(plan, every)  # (--keep-out): in the projections, named
    df = pt.aggregate(plan, recs)
    print(pt.format_table(df))
    gaps = pt.tuning_gaps(plan, recs)  # evaluation runs selected on missing data
    done = pr.complete(plan, recs) and not gaps
    if done and plan.carry_seeds:  # the projections may take the 8-node runs' steps
        jobs = co.jobs(plan, pr.chosen(plan, recs), pt.leading(df))
        done = not pr.pending(jobs, recs)
    _write(df, results_dir, plan.sweep_id, done, [*measured.status(plan, every), *gaps])
    carry = co.table(co.runs(plan, recs))
    if not carry.empty:
        print(carry.to_string(index=False))
        path, _ = write_sweep_table(
            carry, results_dir, "ablation", f"{plan.sweep_id}-carryover", done
        )
        print(f"steps carry-over table: {path}", flush=True)
    m = measured.table(plan, every)
    print(measured.format_table(m))
    if not m.empty:
        where = f"{plan.sweep_id}-{measured.MEASURED_TABLE}"
        path, _ = write_sweep_table(m, results_dir, "ablation", where, done)
        print(f"measured table: {path}", flush=True)


def _status(args: argparse.Namespace) -> None:
    from bench.sweeps import ablation as ab
    from bench.sweeps import measured
    from bench.sweeps import protocol as pr
    from bench.sweeps.common import sweep_records
    from bench.sweeps.resume import progress

    plan = _load(args.results_dir, args.status)
    recs = sweep_records(args.results_dir, plan.sweep_id)
    how = f"launcher {plan.launcher}" if plan.launcher else "the local run queue"
    lines = (
        measured.status(plan, recs) if isinstance(plan, pr.Plan)
        else [progress("grid", plan.keys(), recs, ab.key_of)]
    )  # fmt: skip
    if plan.launcher:  # each Slurm job: its state and exit code, its run, nodes, requeues
        from bench.launch.submit import status_lines

        lines += status_lines(Path(args.results_dir) / "hydra" / "ablation" / plan.sweep_id, recs)
    _sweep.print_status(f"sweep {plan.sweep_id}: {plan.experiment} on cluster {plan.cluster}, "
                        f"{how}", lines)  # fmt: skip


def _stage(name: str, jobs: list, order: list[str], where: str = "") -> str:
    """One line: a stage's runs, per method (in the plan's ``order``)."""
    from collections import Counter

    n = Counter(j.comm for j in jobs)
    per = ", ".join(f"{m} {n[m]}" for m in order if n[m])
    return f"{name}: {len(jobs)} runs{where}" + (f" ({per})" if per else "")


def _dry_run(plan, verbose: bool) -> None:
    """What the sweep needs, its stages per method and its first command line (``verbose``:
    every job's); the grid's duration at the median wall time of earlier runs (a protocol's
    plan notes say it already)."""
    import os
    import statistics

    from bench.sweeps import extension as ext
    from bench.sweeps import protocol as pr
    from reproduce._dryrun import duration, earlier_runs

    for note in plan.notes:
        print(f"note: {note}")
    clusters = {plan.cluster}
    if isinstance(plan, pr.Plan):
        clusters |= {"emulated"} if plan.measured else set()
    else:
        times, on = earlier_runs(plan.results_dir, lambda r: r.get("experiment") == plan.experiment)
        n = len(plan.jobs())
        if not times:
            print(
                f"note: {n} runs, duration unknown (no earlier run of {plan.experiment} recorded)"
            )
        else:
            t = statistics.median(float(r["wall_time_s"]) for r in times)
            print(
                f"note: {n} runs, about {duration(n * t)} ({t:.0f} s each: the median wall "
                f"time of {len(times)} recorded run(s) of {plan.experiment}, any method, {on})"
            )
    if "emulated" in clusters:
        who = "this process is root" if os.geteuid() == 0 else "this process is not root"
        print(
            "note: the emulated cluster needs root and iproute2 (it creates network "
            f"namespaces and tc qdiscs; {who})"
        )
    how = f"submitted through {plan.launcher}" if plan.launcher else "run through one run queue"
    if isinstance(plan, pr.Plan):
        from bench.sweeps.measured import MAX_ROUNDS, names

        tune, shaping, timing = plan.tune_jobs(), _first_shaping(plan), plan.timing_jobs()
        jobs = [("tune", j) for j in tune] + [("shape", j) for j in shaping]
        print(_stage("tuning", tune, plan.comms))
        on = f" on {', '.join(names(plan))}"
        if shaping:
            print(f"shaping: {len(shaping)}-{len(shaping) * MAX_ROUNDS} runs{on}, the first "
                  "round at the model's guess of the link, each next one at the link its "
                  "ratio calls for")  # fmt: skip
            print(_stage("timing pass", timing, plan.comms, f"{on}, once shaped"))
        lines = [f"{r} {i}: python -m reproduce train " + " ".join(plan.overrides(j))
                 for i, (r, j) in enumerate(jobs)]  # fmt: skip
        measured = (
            "the timing pass on each measured cluster, the model's projection elsewhere); "
            "before a measured cluster's evaluation, the model's prediction of it "
            f"({plan.sweep_id}-prediction.csv); each configuration selected for a measured "
            f"cluster runs there, one selected only for a projection on {plan.cluster}"
        )
        if not shaping:
            measured = f"the model's projection); each on {plan.cluster}"
        then = (
            f"then per cluster ({', '.join(pr.clusters(plan))}) each method's trial of lowest "
            f"median time to target on the tuning seeds (steps x step time: {measured}; a "
            "selected rate the smallest or largest tried with its knob setting is tried beyond "
            f"(x0.5 or x2, on the tuning seeds, at most {ext.MAX_ROUNDS} rounds) and the rule "
            f"selects again; on each of the {len(plan.eval_seeds)} evaluation seeds ({how})"
        )
    else:
        lines = [f"job {i}: python -m reproduce train " + " ".join(j)
                 for i, j in enumerate(plan.jobs())]  # fmt: skip
        print(f"grid: {len(lines)} runs ({len(plan.comms)} methods x {len(plan.caches)} caches "
              f"x {len(plan.updates)} update modes x {plan.seeds} seeds)")  # fmt: skip
        warm = "" if plan.launcher else ": one launch of the workers, a warm-up"
        then = f"the jobs would be {how}{warm}"
    if verbose:
        print("\n".join(lines))
    elif lines:
        print(f"first: {lines[0].split(': ', 1)[1]}  (every job's command line: --verbose)")
    print(then)


def _keep_out(plan, resumed: bool) -> None:
    """ConfigError unless --keep-out has evaluation runs of another CPU kind to keep out."""
    from bench.registry import ConfigError
    from bench.results.env import cpu_model
    from bench.sweeps import protocol as pr

    here = cpu_model()
    if not resumed or not isinstance(plan, pr.Plan) or not plan.measured:
        raise ConfigError("--keep-out goes with --resume SWEEP_ID of a protocol sweep with "
                          "measured clusters")  # fmt: skip
    if plan.cpu_kind in ("", here):
        raise ConfigError(
            f"--keep-out: this machine is the kind sweep {plan.sweep_id}'s measured runs "
            f"run on ({here}): resume it without --keep-out"
        )


def _run(args: argparse.Namespace, plan, resumed: bool) -> int:
    """Run the sweep (what is missing of it, when resumed); its exit status."""
    from bench.registry import ConfigError
    from bench.sweeps import carryover as co
    from bench.sweeps import measured
    from bench.sweeps import protocol as pr
    from bench.sweeps import protocol_table as pt
    from bench.sweeps.common import pin_profile, run_queued, sweep_records
    from bench.sweeps.resume import write_sweep_table

    protocol = isinstance(plan, pr.Plan)
    if protocol:
        lo, hi, _, _ = pr.estimate(plan)
        shaping = ", shaping" if plan.measured else ""
        n = f"{len(plan.tune_jobs())} tuning runs{shaping}, {len(plan.timing_jobs())} " \
            f"timing runs, a rate extension, then {len(plan.eval_seeds)} evaluation seeds x " \
            "each selected configuration" \
            + (f", then {plan.carry_seeds} seeds of them at 8 x 2 (steps carry-over)"
               if plan.carry_seeds else "") + f" ({lo}-{hi} runs in all)"  # fmt: skip
        what = f"protocol {plan.name} on {plan.experiment}"
    else:
        n, what = f"{len(plan.jobs())} jobs", plan.experiment
    how = f", launcher {plan.launcher}" if plan.launcher else ""
    print(f"sweep {plan.sweep_id}: {what}, cluster {plan.cluster}{how}: {n}")
    if args.dry_run:
        _dry_run(plan, args.verbose)
        return 0
    if not resumed:  # one link for the whole sweep (an emulated profile timed once, here)
        pinned, note = pin_profile(_first_job(plan))
        plan.cluster_overrides = [*plan.cluster_overrides, *pinned]
        plan.notes += [note] if note else []
        if protocol:  # the measured clusters' first guess of their link, timed once too
            from bench.sweeps.measured import pin

            plan.notes += [note] if (note := pin(plan)) else []
        print(f"plan: {plan.save()}")
    for note in plan.notes:
        print(f"note: {note}")
    if args.rerun:
        known = {str(r.get("run_id")) for r in sweep_records(args.results_dir, plan.sweep_id)}
        if not resumed or (missing := [x for x in args.rerun if x not in known]):
            fail(
                "--rerun needs --resume SWEEP_ID"
                if not resumed
                else f"--rerun: run {missing[0]} is not a run of sweep {plan.sweep_id}",
                2,
            )
    if resumed and not args.rerun_failed:
        recs = sweep_records(args.results_dir, plan.sweep_id)
        if errors := sum(r.get("status") == "error" for r in recs):
            print(f"note: {errors} error run(s) are not run again; --rerun-failed runs them too")
    sweep_dir = Path(args.results_dir) / "hydra" / "ablation" / plan.sweep_id
    run = _sweep.runner(plan, run_queued)

    def write_tuning(df, path: Path) -> bool:  # partial while the selection's data is not
        gaps = pt.tuning_gaps(plan, sweep_records(plan.results_dir, plan.sweep_id), df)
        where, wrote = write_sweep_table(df, plan.results_dir, "ablation", path.stem, not gaps)
        for gap in gaps:
            print(f"note: tuning table {where} is partial: {gap}", flush=True)
        return wrote

    try:
        if protocol:
            rcs = measured.run(plan, run, sweep_dir, write_tuning, rerun=_sweep.rerun_of(args),
                               until=args.until, keep_out=args.keep_out)  # fmt: skip
            if args.until:
                print(f"stopped after {args.until}; go on with: {_sweep.again('ablation', plan)}")
                return 1 if any(rcs) else 0
            # the steps carry-over, once every evaluation run is recorded
            recs = measured.counted(plan, sweep_records(plan.results_dir, plan.sweep_id))
            if plan.carry_seeds and pr.complete(plan, recs):
                jobs = co.jobs(plan, pr.chosen(plan, recs), pt.leading(pt.aggregate(plan, recs)))
                if todo := pr.pending(jobs, recs, _sweep.rerun_of(args)):
                    print(f"steps carry-over: {len(todo)} of {len(jobs)} runs at {co.NODES} "
                          "nodes to go")  # fmt: skip
                    rcs += run([co.overrides(plan, j) for j in todo], sweep_dir / co.CARRY,
                               plan.experiment)  # fmt: skip
        else:
            rcs = plan.run(sweep_dir, run, rerun=_sweep.rerun_of(args))
    except KeyboardInterrupt:
        print(f"interrupted; go on with: {_sweep.again('ablation', plan)}", file=sys.stderr)
        sys.exit(130)
    except ConfigError as e:  # tuning runs left no record: no evaluation submitted
        fail(str(e), 1)
    failed = sum(rc != 0 for rc in rcs)
    if failed:
        print(f"note: {failed} of {len(rcs)} jobs failed", file=sys.stderr, flush=True)
    try:
        _protocol_table(args.results_dir, plan) if protocol else _table(
            args.results_dir, plan.sweep_id, plan)  # fmt: skip
    except ConfigError as e:
        fail(str(e), 1)
    return 1 if failed else 0


def main(argv: list[str]) -> None:
    from bench.data.cache import inspect_only
    from bench.registry import ConfigError
    from bench.sweeps import protocol as pr

    args = _parser().parse_args(argv)
    try:
        if args.status:
            _status(args)
            return
        if args.aggregate:
            kind = _kind(args.results_dir, args.aggregate)
            plan = _load(args.results_dir, args.aggregate) if kind else None
            if isinstance(plan, pr.Plan):
                _protocol_table(args.results_dir, plan)
            else:
                _table(args.results_dir, args.aggregate, plan)
            return
        if args.until and args.grid:
            fail("--until: the --grid sweep has no tuning stage (it is the protocol's)")
        sweeps = []  # every sweep planned and checked before the first one runs
        # the workload named, else (the protocol named by nothing) each in turn
        one = args.workload or args.experiment or args.grid or args.quick
        each = [args.workload] if one or args.resume or args.sweep_id else list(pr.WORKLOADS)
        with inspect_only() if args.dry_run else contextlib.nullcontext():
            for w in each:
                a = argparse.Namespace(**{**vars(args), "workload": w})
                sweeps.append((a, *_plan(a)))
    except ConfigError as e:
        fail(str(e))
    code = 0
    for a, plan, resumed in sweeps:
        with _sweep.full_disk("ablation", plan):
            code = max(code, _run(a, plan, resumed))
    protocols = [p for _, p, _ in sweeps if isinstance(p, pr.Plan)]
    if args.dry_run and len(protocols) > 1:  # the workloads one after the other
        lo, hi, t_lo, t_hi = (sum(x) for x in zip(*map(pr.estimate, protocols), strict=True))
        print(f"in all: {len(protocols)} sweeps, {lo}-{hi} runs, about {t_lo / 60:.1f}-"
              f"{t_hi / 60:.1f} hours on 2 cores (docs/protocol.md); nothing run")  # fmt: skip
    if code:
        sys.exit(code)
