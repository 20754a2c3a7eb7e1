"""``python -m reproduce scaling [options] [overrides]``

Training throughput and scaling efficiency against workers and nodes, per communication
method, from short recorded runs (a fixed number of steps, no target), beside the
performance model's projection to the paper's 16 x 8 V100 at 25 Gbit/s; one table,
printed and written to ``<results-dir>/scaling/<sweep_id>.csv`` (``bench/sweeps/scaling.py``
says how each number is made).  Trailing ``key=value`` overrides apply to every run.

``--launcher slurm`` (or ``submitit_local``): each run submitted as its own Hydra job,
on an allocation of its topology's nodes and GPUs (``bench/launch/submit.py``); on Slurm
the cluster is ``multinode`` and a topology NxG is N nodes of G GPUs.  ``--sweep-id``,
``--resume``, ``--status`` and ``--aggregate`` work as for ``ablation``; a failed run
measured nothing, so a resumed sweep runs it again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reproduce import _sweep
from reproduce._cli import RESULTS, Parser

USAGE = """scaling [--cluster local|emulated|multinode] [--comm a,b] [--topologies 1x1,2x2]
           [--steps N] [--quick] [--dry-run] [--launcher slurm] [--sweep-id ID]
           [--resume ID] [--status ID] [--aggregate ID]
                          throughput and scaling efficiency vs workers and nodes, beside
                          the model's projection; runs/scaling/<sweep_id>.csv"""

QUICK = {"topologies": "1x1,2x1", "steps": 3}


def _parser() -> argparse.ArgumentParser:
    ap = Parser(
        "scaling",
        summary="Training throughput and scaling efficiency against workers and nodes, per "
        "communication method, from short recorded runs, beside the performance model's "
        f"projection ({RESULTS}/scaling/<sweep_id>.csv by default).",
        example="python -m reproduce scaling --quick --comm dense,hitopk --dry-run",
        details=__doc__,
    )
    ap.add_argument("--experiment", default="dawnbench_digits", help="conf/experiment/<E>.yaml")
    ap.add_argument("--cluster", default="", help="local | emulated | multinode (default "
                    "local; multinode on Slurm)")  # fmt: skip
    ap.add_argument("--comm", default="dense,hitopk", help="comma-separated methods")
    ap.add_argument("--topologies", default="", help="NODESxWORKERS list (default 1x1,1x2,2x1,2x2)")
    ap.add_argument("--steps", type=int, default=0, help="steps per epoch, 2 epochs (default 5)")
    ap.add_argument("--batch-per-worker", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="1x1 and 2x1, 3 steps")
    ap.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
    ap.add_argument("--aggregate", metavar="SWEEP_ID", help="rebuild the table from records")
    _sweep.add_options(ap, rerun_failed=False)
    ap.add_argument(
        "--results-dir",
        metavar="DIR",
        default=RESULTS,
        help=f"where the runs' records and the table go (default {RESULTS}/, git-ignored)",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    return ap


def _fail(msg: str, code: int = 2) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def _new_plan(args: argparse.Namespace, jobs: list[str], pin: bool = True):
    from bench.sweeps import scaling as sc
    from bench.sweeps.common import cluster_profile, new_sweep_id, pin_link, split_list

    quick = QUICK if args.quick else {}
    link, note = cluster_profile(args.cluster, jobs)
    plan = sc.Plan(
        sweep_id=args.sweep_id or new_sweep_id("scaling"),
        experiment=args.experiment,
        cluster=args.cluster,
        comms=split_list(args.comm),
        topologies=tuple(
            sc.parse_topologies(args.topologies or quick.get("topologies", "1x1,1x2,2x1,2x2"))
        ),
        steps=args.steps or quick.get("steps", 5),
        batch_per_worker=args.batch_per_worker,
        results_dir=args.results_dir,
        extra=[*jobs, *link],
    )
    plan.check()
    if link and pin and not args.dry_run:  # the link of the largest topology, for every run
        biggest = max(plan.jobs(), key=lambda j: j[0][1] * j[0][2])[1]
        pinned, pnote = pin_link(biggest)
        plan.extra, note = [*plan.extra, *pinned], pnote or note
    return plan, note


def _plan(args: argparse.Namespace):
    """(the plan, a note on its links, whether it is resumed)."""
    from bench.sweeps import scaling as sc
    from bench.sweeps.resume import RUN_FIELDS, save_plan

    jobs, hydra, launcher = _sweep.launcher_of(args)
    args.cluster = _sweep.default_cluster(args.cluster, launcher, "local")
    sid = args.resume or args.sweep_id
    path = Path(args.results_dir) / "scaling" / f"{sid}.plan.json"
    with _sweep.checking_for(launcher):
        if sid and (args.resume or path.exists()):
            plan, note = sc.Plan.load(args.results_dir, sid), f"resuming {sid}"
            if not args.resume:  # the same command again: the same sweep, or refused
                fresh, _ = _new_plan(args, jobs, pin=False)
                n = len(fresh.extra)  # the link pinned when the sweep started comes after
                if list(plan.extra[:n]) == list(fresh.extra):
                    fresh.extra = plan.extra
                save_plan(fresh, path, compare_skip=RUN_FIELDS)
            resumed = True
        else:
            (plan, note), resumed = _new_plan(args, jobs), False
    _sweep.use_launcher(plan, launcher, hydra)
    _sweep.check_launch(plan, [job for _, job in plan.jobs()])
    return plan, note, resumed


def _table(plan, proj) -> int:
    """Print and write the table; the number of runs without a measurement."""
    import pandas as pd

    from bench.sweeps import scaling as sc
    from bench.sweeps.common import sweep_records
    from bench.sweeps.resume import progress, write_sweep_table

    recs = sweep_records(plan.results_dir, plan.sweep_id)
    df = sc.measured(recs, plan.sweep_id)
    table = pd.concat([df, proj], ignore_index=True) if len(proj) else df
    print(sc.format_table(table))
    missing = len(plan.pending())
    if missing:
        keys = [p for p, _ in plan.jobs()]
        print(f"missing: {progress('scaling', keys, recs, sc.key_of)}", flush=True)
    path, _ = write_sweep_table(table, plan.results_dir, "scaling", plan.sweep_id, not missing)
    print(f"table: {path}" + (" (partial: runs are missing)" if missing else ""), flush=True)
    return missing


def main(argv: list[str]) -> None:
    from bench.registry import ConfigError
    from bench.sweeps import scaling as sc

    args = _parser().parse_args(argv)
    try:
        if args.status or args.aggregate:
            plan = sc.Plan.load(args.results_dir, args.status or args.aggregate)
            resumed, note = True, ""
        else:
            plan, note, resumed = _plan(args)
        proj = sc.projected(plan.comms, plan.sweep_id)  # before any run: a changed model stops here
    except (ConfigError, sc.ModelChanged) as e:
        _fail(str(e))
    if args.status:
        from bench.sweeps.common import sweep_records
        from bench.sweeps.resume import progress

        recs = sweep_records(plan.results_dir, plan.sweep_id)
        how = f"launcher {plan.launcher}" if plan.launcher else "here"
        line = progress("scaling", [p for p, _ in plan.jobs()], recs, sc.key_of)
        _sweep.print_status(f"sweep {plan.sweep_id}: cluster {plan.cluster}, {how}", [line])
        return
    if args.aggregate:
        _table(plan, proj)
        return
    jobs = plan.jobs()
    how = f", launcher {plan.launcher}" if plan.launcher else ""
    print(
        f"sweep {plan.sweep_id}: {plan.experiment} on cluster {plan.cluster}{how}, {len(jobs)} runs"
    )
    print(f"note: {note}")
    for s in plan.skipped():
        print(f"note: skipped {s}")
    if args.dry_run:
        for i, (_, job) in enumerate(jobs):
            print(f"run {i}: python -m reproduce train " + " ".join(job))
        print(f"projected: {len(proj)} rows from the performance model")
        return
    if not resumed:
        print(f"plan: {plan.save()}")
    from bench.sweeps.common import run_each

    sweep_dir = Path(args.results_dir) / "hydra" / "scaling" / plan.sweep_id
    try:
        failed = sum(rc != 0 for rc in plan.run(sweep_dir, _sweep.runner(plan, run_each)))
    except KeyboardInterrupt:
        print(f"interrupted; go on with: {_sweep.again('scaling', plan)}", file=sys.stderr)
        sys.exit(130)
    missing = _table(plan, proj)
    sys.exit(1 if failed or missing else 0)
