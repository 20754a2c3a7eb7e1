"""``python -m reproduce scaling [options] [overrides]``

Training throughput and scaling efficiency against workers and nodes, per communication
method, from short recorded runs (a fixed number of steps, no target), beside the
performance model's projection to the paper's 16 x 8 V100 at 25 Gbit/s; one table,
printed and written to ``<results-dir>/scaling/<sweep_id>.csv`` (``bench/sweeps/scaling.py``
says how each number is made).  Trailing ``key=value`` overrides apply to every run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reproduce._cli import RESULTS, Parser

USAGE = """scaling [--cluster local|emulated|multinode] [--comm a,b] [--topologies 1x1,2x2]
           [--steps N] [--quick] [--dry-run]
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
    ap.add_argument("--cluster", default="local", help="local | emulated | multinode")
    ap.add_argument("--comm", default="dense,hitopk", help="comma-separated methods")
    ap.add_argument("--topologies", default="", help="NODESxWORKERS list (default 1x1,1x2,2x1,2x2)")
    ap.add_argument("--steps", type=int, default=0, help="steps per epoch, 2 epochs (default 5)")
    ap.add_argument("--batch-per-worker", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="1x1 and 2x1, 3 steps")
    ap.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
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


def main(argv: list[str]) -> None:
    from bench.registry import ConfigError
    from bench.sweeps import scaling as sc
    from bench.sweeps.common import (
        cluster_profile,
        new_sweep_id,
        pin_link,
        split_list,
        sweep_records,
        write_table,
    )

    args = _parser().parse_args(argv)
    quick = QUICK if args.quick else {}
    try:
        link, note = cluster_profile(args.cluster, args.overrides)
        plan = sc.Plan(
            sweep_id=new_sweep_id("scaling"),
            experiment=args.experiment,
            cluster=args.cluster,
            comms=split_list(args.comm),
            topologies=sc.parse_topologies(
                args.topologies or quick.get("topologies", "1x1,1x2,2x1,2x2")
            ),
            steps=args.steps or quick.get("steps", 5),
            batch_per_worker=args.batch_per_worker,
            results_dir=args.results_dir,
            extra=[*args.overrides, *link],
        )
        plan.check()
        if link and not args.dry_run:  # the link of the largest topology, for every run
            biggest = max(plan.jobs(), key=lambda j: j[0][1] * j[0][2])[1]
            pinned, pnote = pin_link(biggest)
            plan.extra, note = [*plan.extra, *pinned], pnote or note
        proj = sc.projected(plan.comms, plan.sweep_id)  # before any run: a changed model stops here
    except (ConfigError, sc.ModelChanged) as e:
        _fail(str(e))
    jobs = plan.jobs()
    print(f"sweep {plan.sweep_id}: {args.experiment} on cluster {args.cluster}, {len(jobs)} runs")
    print(f"note: {note}")
    for s in plan.skipped():
        print(f"note: skipped {s}")
    if args.dry_run:
        for i, (_, job) in enumerate(jobs):
            print(f"run {i}: python -m reproduce train " + " ".join(job))
        print(f"projected: {len(proj)} rows from the performance model")
        return
    from bench.sweeps.common import run_train

    failed = sum(
        rc != 0
        for rc in plan.run(Path(args.results_dir) / "hydra" / "scaling" / plan.sweep_id, run_train)
    )
    df = sc.measured(sweep_records(args.results_dir, plan.sweep_id), plan.sweep_id)
    if failed or len(df) < len(jobs):
        print(f"note: {len(df)} of {len(jobs)} runs finished", file=sys.stderr, flush=True)
    import pandas as pd

    table = pd.concat([df, proj], ignore_index=True) if len(proj) else df
    path = Path(args.results_dir) / "scaling" / f"{plan.sweep_id}.csv"
    write_table(table, path)
    print(sc.format_table(table))
    print(f"table: {path}", flush=True)
    sys.exit(1 if failed else 0)
