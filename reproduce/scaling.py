"""``python -m reproduce scaling [options] [overrides]``

Measured scaling: at each size NODESxWORKERS (default 1x1,2x1,4x1,8x1; one node on the
local cluster, more on emulated nodes, each its own network namespace on a link
paper-scaled at that size), the step time of the same workers with communication removed
(``comm=nocomm``) and with each method, in one launch of the workers per size; scaling
efficiency = compute-only step / step, beside the textbook throughput(N) / (N x
throughput(1)); the performance model's prediction of every step time, made before the
first run (``<results-dir>/scaling/<sweep_id>.plan.json``), with its error; the
projection to 16 x 8 V100 at 25 Gbit/s with its band.  One table, printed and written to
``<results-dir>/scaling/<sweep_id>.csv`` (``bench/sweeps/scaling.py`` and
``scaling_table.py`` say how each number is made).  Trailing ``key=value`` overrides
apply to every run.  ``--aggregate SWEEP_ID`` writes the table again from the records
and the plan alone.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reproduce._cli import RESULTS, Parser, fail

USAGE = """scaling [--cluster emulated|local] [--comm a,b] [--topologies 1x1,2x1,4x1,8x1]
           [--steps N] [--epochs N] [--quick] [--dry-run] [--aggregate SWEEP_ID]
                          measured scaling efficiency vs nodes per method, the model's
                          prediction of every step time; runs/scaling/<sweep_id>.csv"""


def _parser() -> argparse.ArgumentParser:
    from bench.sweeps import scaling as sc

    ap = Parser(
        "scaling",
        summary="Scaling efficiency against nodes per communication method, measured at each "
        "size against the same workers with communication removed, beside the performance "
        f"model's prediction and projection ({RESULTS}/scaling/<sweep_id>.csv by default).",
        example="python -m reproduce scaling --quick --dry-run",
        details=__doc__,
    )
    ap.add_argument("--experiment", default="dawnbench_digits", help="conf/experiment/<E>.yaml")
    ap.add_argument(
        "--cluster", default="emulated", help="cluster of the sizes of >= 2 nodes: emulated | local"
    )
    ap.add_argument("--comm", default=",".join(sc.COMMS), help="comma-separated methods")
    ap.add_argument(
        "--topologies", default="", help=f"NODESxWORKERS list (default {sc.TOPOLOGIES})"
    )
    ap.add_argument("--steps", type=int, default=0, help="steps per epoch (default 4)")
    ap.add_argument("--epochs", type=int, default=3, help="epochs per run, the first warm-up")
    ap.add_argument("--batch-per-worker", type=int, default=32)
    ap.add_argument(
        "--quick", action="store_true",
        help="local cluster, 1x1 and 2x1, dense and hitopk, 2 steps (no root needed)",
    )  # fmt: skip
    ap.add_argument("--dry-run", action="store_true", help="print the runs, run nothing")
    ap.add_argument("--aggregate", metavar="SWEEP_ID", default="", help="table of a finished sweep")
    ap.add_argument(
        "--results-dir",
        metavar="DIR",
        default=RESULTS,
        help=f"where the runs' records and the table go (default {RESULTS}/, git-ignored)",
    )
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    return ap


def _plan(args: argparse.Namespace):
    from bench.sweeps import scaling as sc
    from bench.sweeps.common import cluster_profile, new_sweep_id, split_list

    q = sc.QUICK if args.quick else {}
    cluster = q.get("cluster", args.cluster) if args.cluster == "emulated" else args.cluster
    if cluster not in ("emulated", "local"):
        from bench.registry import ConfigError

        raise ConfigError(f"--cluster {cluster!r}: the study runs on emulated or local")
    link, note = cluster_profile(cluster, args.overrides)
    comm = q.get("comms", args.comm) if args.comm == ",".join(sc.COMMS) else args.comm
    plan = sc.Plan(
        sweep_id=new_sweep_id("scaling"),
        experiment=args.experiment,
        cluster=cluster,
        comms=split_list(comm),
        topologies=sc.parse_topologies(args.topologies or q.get("topologies", sc.TOPOLOGIES)),
        steps=args.steps or q.get("steps", 4),
        epochs=args.epochs,
        batch_per_worker=args.batch_per_worker,
        results_dir=args.results_dir,
        link=link,
        extra=list(args.overrides),
    )
    return plan, note


def main(argv: list[str]) -> None:
    from bench.registry import ConfigError
    from bench.sweeps import scaling as sc
    from bench.sweeps import scaling_table as st

    args = _parser().parse_args(argv)
    if args.aggregate:
        from bench.sweeps.common import sweep_records, write_table

        try:
            plan_doc = sc.read_plan(args.results_dir, args.aggregate)
        except ConfigError as e:
            fail(str(e))
        table = st.build_table(sweep_records(args.results_dir, args.aggregate), plan_doc)
        _report(table, Path(args.results_dir) / "scaling" / f"{args.aggregate}.csv", write_table)
        return
    try:
        plan, note = _plan(args)
        plan.check()
    except ConfigError as e:
        fail(str(e))
    jobs = plan.jobs()
    sizes = ", ".join(f"{n}x{m}" for n, m in plan.topologies)
    print(
        f"sweep {plan.sweep_id}: {args.experiment}, sizes {sizes} ({plan.cluster} from 2 "
        f"nodes), {len(jobs)} runs in {len(plan.topologies)} launches"
    )
    print(f"note: {note}; one profile per size")
    for s in plan.skipped():
        print(f"note: skipped {s}")
    if args.dry_run:
        for i, (_, job) in enumerate(jobs):
            print(f"run {i}: python -m reproduce train " + " ".join(job))
        return
    _run(plan, args.results_dir)


def _run(plan, results_dir: str) -> None:
    from bench.sweeps import scaling as sc
    from bench.sweeps import scaling_table as st
    from bench.sweeps.common import run_queued, sweep_records, write_table

    doc = plan.prepare()  # every size's profile and every prediction, before any run
    for s in doc["sizes"]:
        print(f"size {s['nodes']}x{s['workers_per_node']}: {s['profile']}", flush=True)
    print(f"plan (predictions before the runs): {sc.write_plan(doc, results_dir)}", flush=True)
    jobs = [job for _, job in plan.jobs()]
    sweep_dir = Path(results_dir) / "hydra" / "scaling" / plan.sweep_id
    statuses = run_queued(jobs, sweep_dir, plan.experiment)
    failed = sum(rc != 0 for rc in statuses)
    table = st.build_table(sweep_records(results_dir, plan.sweep_id), doc)
    done = int((table["kind"] == "measured").sum())
    if failed or done < len(jobs):
        print(f"note: {done} of {len(jobs)} runs finished", file=sys.stderr, flush=True)
    _report(table, Path(results_dir) / "scaling" / f"{plan.sweep_id}.csv", write_table)
    sys.exit(1 if failed else 0)


def _report(table, path: Path, write_table) -> None:
    from bench.registry import ConfigError
    from bench.sweeps import scaling_table as st

    try:
        write_table(table, path)
    except ConfigError as e:
        fail(str(e), 1)
    print(st.format_table(table))
    for line in st.summary(table):
        print(line)
    print(f"table: {path}", flush=True)
