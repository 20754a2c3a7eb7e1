"""``python -m reproduce ablation [options] [overrides]``

Time to target over communication x cache x update mode x seeds on one experiment and
cluster: ordinary training runs, one after the other (each what ``python -m reproduce
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

USAGE = """ablation [--experiment E] [--cluster C] [--seeds N] [--comm a,b] [--quick]
           [--dry-run] [--aggregate SWEEP_ID]
                          time to target over comm x cache x update x seeds (training
                          runs), one table in runs/ablation/<sweep_id>.csv"""


def _parser() -> argparse.ArgumentParser:
    ap = Parser(
        "ablation",
        summary="Time to target over communication x cache x update mode x seeds: one "
        "training run per job, through one run queue, and one table of the sweep "
        f"({RESULTS}/ablation/<sweep_id>.csv by default).",
        example="python -m reproduce ablation --quick --cluster local --dry-run",
        details=__doc__,
    )
    ap.add_argument("--experiment", default="dawnbench_digits", help="conf/experiment/<E>.yaml")
    ap.add_argument("--cluster", default="emulated", help="local | emulated | multinode")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per configuration")
    ap.add_argument("--comm", default="", help="comma-separated (default: all six)")
    ap.add_argument("--cache", default="", help="comma-separated (default: none,multilevel)")
    ap.add_argument("--update", default="", help="comma-separated (default: naive,flat)")
    ap.add_argument("--quick", action="store_true", help="dense and hitopk, 1 seed")
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


def _plan(args: argparse.Namespace):
    from bench.sweeps import ablation as ab
    from bench.sweeps.common import cluster_profile, new_sweep_id, pin_profile, split_list

    quick = ab.QUICK if args.quick else {}
    plan = ab.Plan(
        sweep_id=new_sweep_id("ablation"),
        experiment=args.experiment,
        cluster=args.cluster,
        comms=split_list(args.comm) or quick.get("comm", ab.COMMS),
        caches=split_list(args.cache) or quick.get("cache", ab.CACHES),
        updates=split_list(args.update) or quick.get("update", ab.UPDATES),
        seeds=quick.get("seeds", args.seeds) if args.quick else args.seeds,
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


def main(argv: list[str]) -> None:
    from bench.registry import ConfigError

    args = _parser().parse_args(argv)
    try:
        if args.aggregate:
            _table(args.results_dir, args.aggregate)
            return
        plan = _plan(args)
    except ConfigError as e:
        _fail(str(e))
    jobs = plan.jobs()
    print(f"sweep {plan.sweep_id}: {args.experiment} on cluster {args.cluster}, {len(jobs)} jobs")
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
