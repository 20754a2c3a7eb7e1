"""``python -m reproduce ablation [options] [overrides]``

By default the tuning protocol (:mod:`bench.sweeps.protocol`): every method's search
space tuned on tuning seeds with the same number of trials, the configuration chosen by
a rule fixed in advance, then 5 fresh evaluation seeds per method; its table
(``bench/sweeps/protocol_table.py``) has 95 % intervals.  ``--resume SWEEP_ID`` goes on
with an interrupted protocol sweep, skipping every recorded run.

``--grid``: time to target over communication x cache x update mode x seeds on one
experiment and cluster: ordinary training runs, one after the other (each what ``python -m reproduce
train`` with the job's Hydra overrides runs, writing its record tagged with the sweep id;
a failed job does not stop the others), trained through a run queue
(:mod:`bench.launch.runqueue`: the workers are launched once, not once per run), then one table
per sweep, printed and written to
``<results-dir>/ablation/<sweep_id>.csv`` (``bench/sweeps/ablation.py`` says what each column
is).  Trailing ``key=value`` overrides apply to every job.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reproduce._cli import RESULTS, Parser

USAGE = """ablation [--workload W | --experiment E] [--cluster C] [--seeds N] [--comm a,b]
           [--quick] [--grid] [--dry-run] [--resume SWEEP_ID] [--aggregate SWEEP_ID]
                          the tuning protocol (tune, select, 5 evaluation seeds; --grid:
                          comm x cache x update x seeds), one table in
                          runs/ablation/<sweep_id>.csv"""


def _parser() -> argparse.ArgumentParser:
    ap = Parser(
        "ablation",
        summary="The comparison the suite exists for: every communication method tuned with "
        "the same budget on tuning seeds, the chosen configuration evaluated on 5 fresh "
        "seeds, time to target with 95 % intervals against dense and the best peer "
        f"({RESULTS}/ablation/<sweep_id>.csv by default); --grid runs the older "
        "comm x cache x update x seeds grid instead.",
        example="python -m reproduce ablation --quick --cluster local --dry-run",
        details=__doc__,
    )
    ap.add_argument("--experiment", default="", help="conf/experiment/<E>.yaml")
    ap.add_argument("--workload", default="", help="image | translation (the protocol's)")
    ap.add_argument("--cluster", default="emulated", help="local | emulated | multinode")
    ap.add_argument("--seeds", type=int, default=None, help="evaluation seeds (protocol: 5) "
                    "or seeds per configuration (--grid: 3)")  # fmt: skip
    ap.add_argument("--comm", default="", help="comma-separated (default: all six)")
    ap.add_argument("--cache", default="", help="--grid: comma-separated (none,multilevel)")
    ap.add_argument("--update", default="", help="--grid: comma-separated (naive,flat)")
    ap.add_argument("--quick", action="store_true", help="dense and hitopk, 1 seed each")
    ap.add_argument("--grid", action="store_true", help="the comm x cache x update grid")
    ap.add_argument("--order-seed", type=int, default=None, help="protocol: run order seed")
    ap.add_argument("--resume", metavar="SWEEP_ID", help="protocol: go on with a sweep")
    ap.add_argument("--dry-run", action="store_true", help="print the jobs, run nothing")
    ap.add_argument("--aggregate", metavar="SWEEP_ID", help="rebuild the table from records")
    ap.add_argument(
        "--results-dir",
        metavar="DIR",
        default=RESULTS,
        help=f"where the jobs' records and the table go (default {RESULTS}/, git-ignored)",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every job")
    return ap


def _fail(msg: str, code: int = 2) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def _experiment(args: argparse.Namespace) -> str:
    from bench.registry import ConfigError
    from bench.sweeps.protocol import WORKLOADS

    if args.workload and args.experiment:
        raise ConfigError("give --workload or --experiment, not both")
    if args.workload:
        if args.workload not in WORKLOADS:
            raise ConfigError(f"unknown workload {args.workload!r}; known: {', '.join(WORKLOADS)}")
        return WORKLOADS[args.workload]
    return args.experiment or "dawnbench_digits"


def _protocol_plan(args: argparse.Namespace):
    import random

    from bench.registry import ConfigError
    from bench.sweeps import protocol as pr
    from bench.sweeps.common import cluster_profile, new_sweep_id, split_list

    if args.resume:
        plan = pr.Plan.load(args.results_dir, args.resume)
        plan.notes.append(f"resuming {args.resume}: recorded runs are not run again")
        return plan
    if args.cache or args.update:
        raise ConfigError("--cache and --update narrow the --grid sweep only")
    quick = pr.QUICK if args.quick else {}
    n = args.seeds if args.seeds is not None else len(quick.get("eval_seeds", pr.EVAL_SEEDS))
    if n < 1:
        raise ConfigError(f"--seeds must be >= 1, got {n}")
    order_seed = args.order_seed if args.order_seed is not None else random.randrange(10**6)
    plan = pr.Plan(
        sweep_id=new_sweep_id("ablation"),
        experiment=_experiment(args),
        cluster=args.cluster,
        comms=split_list(args.comm) or quick.get("comms", pr.COMMS),
        tune_seeds=quick.get("tune_seeds", pr.TUNE_SEEDS),
        eval_seeds=tuple(range(n)),
        trials=quick.get("trials"),
        order_seed=order_seed,
        results_dir=args.results_dir,
        extra=args.overrides,
    )
    plan.check()
    if n < 5 and not args.quick:
        plan.notes.append(f"{n} evaluation seeds: the protocol asks for at least 5")
    plan.notes.append(
        f"protocol {plan.name}: tuning seeds {list(plan.tune_seeds)}, evaluation seeds "
        f"{list(plan.eval_seeds)}, run order seed {plan.order_seed}, evaluation every "
        f"{plan.every()} steps"
    )
    plan.cluster_overrides, note = cluster_profile(args.cluster, args.overrides)
    plan.notes.append(note)
    plan.check_jobs()
    return plan


def _pin(plan, job: list[str], dry_run: bool) -> None:
    from bench.sweeps.common import pin_profile

    if not dry_run:  # one link for the whole sweep
        pinned, note = pin_profile(job)
        plan.cluster_overrides = [*plan.cluster_overrides, *pinned]
        if note:
            plan.notes.append(note)


def _plan(args: argparse.Namespace):
    from bench.sweeps import ablation as ab
    from bench.sweeps.common import cluster_profile, new_sweep_id, pin_profile, split_list

    quick = ab.QUICK if args.quick else {}
    seeds = args.seeds if args.seeds is not None else 3
    plan = ab.Plan(
        sweep_id=new_sweep_id("ablation"),
        experiment=_experiment(args),
        cluster=args.cluster,
        comms=split_list(args.comm) or quick.get("comm", ab.COMMS),
        caches=split_list(args.cache) or quick.get("cache", ab.CACHES),
        updates=split_list(args.update) or quick.get("update", ab.UPDATES),
        seeds=quick.get("seeds", seeds) if args.quick else seeds,
        results_dir=args.results_dir,
        extra=args.overrides,
    )
    plan.check_names()
    plan.cluster_overrides, note = cluster_profile(args.cluster, args.overrides)
    plan.notes.append(note)
    plan.check_jobs()  # every job's config, before anything runs
    if not args.dry_run and plan.jobs():  # one link for the whole sweep
        pinned, note = pin_profile(plan.jobs()[0])
        plan.cluster_overrides = [*plan.cluster_overrides, *pinned]
        if note:
            plan.notes.append(note)
    return plan


def _table(records_dir: str, sweep_id: str, expected: int | None = None) -> None:
    from bench.sweeps.ablation import aggregate, format_table
    from bench.sweeps.common import sweep_records, write_table

    recs = sweep_records(records_dir, sweep_id)
    if not recs:
        _fail(f"no records tagged results.sweep_id={sweep_id} in {records_dir}/runs.jsonl")
    if expected is not None and len(recs) < expected:
        print(f"note: {len(recs)} of {expected} jobs left a record", flush=True)
    df = aggregate(recs, sweep_id)
    path = Path(records_dir) / "ablation" / f"{sweep_id}.csv"
    wrote = write_table(df, path)
    print(format_table(df))
    print(f"table: {path}" + ("" if wrote else " (unchanged)"), flush=True)


def _protocol_table(results_dir: str, plan) -> None:
    from bench.sweeps import protocol_table as pt
    from bench.sweeps.common import sweep_records, write_table

    recs = sweep_records(results_dir, plan.sweep_id)
    df = pt.aggregate(plan, recs)
    path = Path(results_dir) / "ablation" / f"{plan.sweep_id}.csv"
    wrote = write_table(df, path)
    print(pt.format_table(df))
    print(f"table: {path}" + ("" if wrote else " (unchanged)"), flush=True)


def _protocol(args: argparse.Namespace) -> None:
    from bench.registry import ConfigError
    from bench.sweeps import protocol as pr
    from bench.sweeps.common import run_queued, write_table

    plan = _protocol_plan(args)
    tune = plan.tune_jobs()
    print(
        f"sweep {plan.sweep_id}: protocol {plan.name} on {plan.experiment}, cluster "
        f"{plan.cluster}: {len(tune)} tuning runs, then {len(plan.eval_seeds)} evaluation "
        f"seeds x {len(plan.comms)} methods"
    )
    if args.dry_run:
        for note in plan.notes:
            print(f"note: {note}")
        for i, job in enumerate(tune):
            print(f"tune {i}: python -m reproduce train " + " ".join(plan.overrides(job)))
        print("then the selected configuration of each method on each evaluation seed")
        return
    if not args.resume:
        first = plan.overrides(tune[0] if tune else pr.Job(pr.EVAL, plan.comms[0], "default", 0))
        _pin(plan, first, args.dry_run)
        print(f"plan: {plan.save()}")
    for note in plan.notes:
        print(f"note: {note}")
    sweep_dir = Path("outputs") / "ablation" / plan.sweep_id
    try:
        rcs = pr.run(plan, run_queued, sweep_dir, write_table)
    except KeyboardInterrupt:
        print(
            f"interrupted; go on with: python -m reproduce ablation --resume {plan.sweep_id} "
            f"--results-dir {args.results_dir}",
            file=sys.stderr,
        )
        sys.exit(130)
    failed = sum(rc != 0 for rc in rcs)
    if failed:
        print(f"note: {failed} of {len(rcs)} jobs failed", file=sys.stderr, flush=True)
    try:
        _protocol_table(args.results_dir, plan)
    except ConfigError as e:
        _fail(str(e), 1)
    sys.exit(1 if failed else 0)


def main(argv: list[str]) -> None:
    from bench.registry import ConfigError

    args = _parser().parse_args(argv)
    try:
        if args.aggregate:
            plan_file = Path(args.results_dir) / "ablation" / f"{args.aggregate}.plan.json"
            if plan_file.exists():
                from bench.sweeps.protocol import Plan

                _protocol_table(args.results_dir, Plan.load(args.results_dir, args.aggregate))
            else:
                _table(args.results_dir, args.aggregate)
            return
        if not args.grid:
            _protocol(args)
            return
        plan = _plan(args)
    except ConfigError as e:
        _fail(str(e))
    jobs = plan.jobs()
    print(f"sweep {plan.sweep_id}: {plan.experiment} on cluster {args.cluster}, {len(jobs)} jobs")
    for note in plan.notes:
        print(f"note: {note}")
    sweep_dir = Path(args.results_dir) / "hydra" / "ablation" / plan.sweep_id
    if args.dry_run:
        for i, job in enumerate(jobs):
            print(f"job {i}: python -m reproduce train " + " ".join(job))
        print("the jobs would run through one run queue: one launch of the workers, a warm-up")
        return
    from bench.sweeps.common import run_queued

    try:
        failed = sum(rc != 0 for rc in plan.run(sweep_dir, run_queued))
    except KeyboardInterrupt:
        print(
            f"interrupted; the finished jobs' table: python -m reproduce ablation "
            f"--aggregate {plan.sweep_id} --results-dir {args.results_dir}",
            file=sys.stderr,
        )
        sys.exit(130)
    if failed:
        print(f"note: {failed} of {len(jobs)} jobs failed", file=sys.stderr, flush=True)
    try:
        _table(args.results_dir, plan.sweep_id, expected=len(jobs))
    except ConfigError as e:
        _fail(str(e), 1)
    sys.exit(1 if failed else 0)
