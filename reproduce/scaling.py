"""``python -m reproduce scaling [options] [overrides]``

Measured scaling: at each size NODESxWORKERS, the step time with communication removed
(``comm=nocomm``) and with each method, in one launch of the workers per size; scaling
efficiency = compute-only step / step, beside the performance model's prediction of every
step time (made before the first run, ``<results-dir>/scaling/<sweep_id>.plan.json``) and
its projection to 16 x 8 V100 at 25 Gbit/s.  One table, printed and written to
``<results-dir>/scaling/<sweep_id>.csv``.  Trailing ``key=value`` overrides apply to every
run.  ``--launcher slurm`` (or ``submitit_local``) submits each run as its own Hydra job on
an allocation of its size; ``--sweep-id``, ``--resume``, ``--status`` and ``--aggregate``
work as for ``ablation``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from reproduce import _sweep
from reproduce._cli import RESULTS, Parser, fail

USAGE = """scaling [--cluster emulated|local] [--comm a,b] [--topologies NxW,...]
           [--steps N] [--epochs N] [--repeats N] [--quick] [--dry-run] [--launcher slurm]
           [--sweep-id ID] [--resume ID] [--status ID] [--aggregate SWEEP_ID]
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
        "--cluster", default="", help="cluster of the sizes of >= 2 nodes: emulated | local "
        "(default emulated; multinode on Slurm, local under submitit_local)",
    )  # fmt: skip
    ap.add_argument("--comm", default=",".join(sc.COMMS), help="comma-separated methods")
    ap.add_argument(
        "--topologies", default="", help=f"NODESxWORKERS list (default {sc.TOPOLOGIES})"
    )
    ap.add_argument("--steps", type=int, default=0, help="steps per epoch (default 5)")
    ap.add_argument(
        "--epochs",
        type=int,
        default=3,
        help="epochs per run, the first warm-up (default %(default)s)",
    )
    ap.add_argument(
        "--batch-per-worker", type=int, default=32, help="batch per worker (default %(default)s)"
    )
    ap.add_argument("--repeats", type=int, default=0, help="runs of every (size, method), "
                    "in rounds: the 95 %% interval's sample (default 3; --quick 2)")  # fmt: skip
    ap.add_argument(
        "--quick", action="store_true",
        help=f"local cluster, 1x1 and 2x1, {sc.QUICK['comms'].replace(',', ' and ')}, 2 steps, "
        "2 rounds (no root needed)",
    )  # fmt: skip
    ap.add_argument("--dry-run", action="store_true", help="check and summarise, run nothing")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="with --dry-run: every run's command line")  # fmt: skip
    ap.add_argument("--aggregate", metavar="SWEEP_ID", default="", help="table of a finished sweep")
    _sweep.add_options(ap, rerun_failed=False)
    ap.results_dir(f"where the runs' records and the table go (default {RESULTS}/, git-ignored)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    return ap


def _new_plan(args: argparse.Namespace, jobs: list[str], launcher: str):
    from bench.registry import ConfigError
    from bench.sweeps import scaling as sc
    from bench.sweeps.common import cluster_profile, new_sweep_id, split_list

    q = sc.QUICK if args.quick else {}
    cluster = args.cluster or _sweep.default_cluster("", launcher, q.get("cluster", "emulated"))
    allowed = ("emulated", "local", "multinode") if launcher else ("emulated", "local")
    if cluster not in allowed:
        raise ConfigError(
            f"--cluster {cluster!r}: the study runs on emulated or local"
            + (" (or multinode through a launcher)" if launcher else "")
        )
    link, note = cluster_profile(cluster, jobs)
    comm = q.get("comms", args.comm) if args.comm == ",".join(sc.COMMS) else args.comm
    plan = sc.Plan(
        sweep_id=args.sweep_id or new_sweep_id("scaling"),
        experiment=args.experiment,
        cluster=cluster,
        comms=split_list(comm),
        topologies=tuple(
            sc.parse_topologies(args.topologies or q.get("topologies", sc.TOPOLOGIES))
        ),
        steps=args.steps or q.get("steps", sc.Plan.steps),
        epochs=args.epochs,
        repeats=args.repeats or q.get("repeats", sc.Plan.repeats),
        batch_per_worker=args.batch_per_worker,
        results_dir=args.results_dir,
        link=link,
        extra=list(jobs),
    )
    return plan, note


def _plan(args: argparse.Namespace):
    """(the plan, a note on its links, its saved document or None when it is new)."""
    from bench.sweeps import scaling as sc

    jobs, hydra, launcher = _sweep.launcher_of(args)
    shaping = ("experiment", "cluster", "comm", "topologies", "steps", "epochs",
               "batch_per_worker", "repeats", "quick")  # fmt: skip
    _sweep.refuse_plan_options(args, _parser(), shaping, jobs)
    sid = args.resume or args.sweep_id
    with _sweep.checking_for(launcher or ""):
        if sid and (args.resume or sc.plan_path(args.results_dir, sid).exists()):
            plan, doc = sc.load(args.results_dir, sid)
            note = f"resuming {sid}"
            if not args.resume:  # the same command again: the same sweep, or refused
                fresh, _ = _new_plan(args, jobs, launcher)
                sc.check_same(fresh, doc)
        else:
            (plan, note), doc = _new_plan(args, jobs, launcher), None
        _sweep.use_launcher(plan, launcher, hydra)
        plan.check()
        _sweep.check_launch(plan, [job for _, job in plan.jobs()])
    return plan, note, doc


def main(argv: list[str]) -> None:
    from bench.registry import ConfigError

    args = _parser().parse_args(argv)
    if args.aggregate or args.status:
        _from_records(args.aggregate or args.status, args.results_dir, bool(args.status))
        return
    try:
        plan, note, doc = _plan(args)
    except ConfigError as e:
        fail(str(e))
    jobs = plan.jobs()
    sizes = ", ".join(f"{n}x{m}" for n, m in plan.topologies)
    how = f", launcher {plan.launcher}" if plan.launcher else ""
    launches = "jobs" if plan.launcher else f"runs in {len(plan.topologies)} launches"
    print(
        f"sweep {plan.sweep_id}: {plan.experiment}, sizes {sizes} ({plan.cluster} from 2 "
        f"nodes{how}), {len(jobs)} {launches}: per size a warm-up, a calibration, then "
        f"{plan.repeats} round(s) of {len(plan.comms)} method(s) and the compute-only reference"
    )
    print(f"note: {note}; one profile per size")
    for s in plan.skipped():
        print(f"note: skipped {s}")
    for line in plan.schedules():
        print(f"note: {line}")
    if args.dry_run:
        print(f"note: {_expected(plan)}")
        lines = [
            f"run {i}: python -m reproduce train " + " ".join(j) for i, (_, j) in enumerate(jobs)
        ]
        if args.verbose:
            print("\n".join(lines))
        else:
            print(f"first: {lines[0].split(': ', 1)[1]}  (every run's command line: --verbose)")
        print("nothing run (--dry-run)")
        return
    with _sweep.full_disk("scaling", plan, then=""):
        _run(plan, doc)


def _expected(plan) -> str:
    """The sweep's expected time (:meth:`bench.sweeps.scaling.Plan.expected`) from the
    earlier scaling runs' wall time per step."""
    from bench.sweeps import scaling as sc
    from reproduce._dryrun import duration, earlier_runs

    def per_step(r: dict) -> float:
        t = (r.get("config") or {}).get("train") or {}
        steps = int(t.get("epochs") or 0) * int(t.get("max_steps_per_epoch") or 0)
        return float(r["wall_time_s"]) / steps if steps else 0.0

    def mine(r: dict) -> bool:
        sweep = str(((r.get("config") or {}).get("results") or {}).get("sweep_id") or "")
        ok = sweep.startswith("scaling") and r.get("experiment") == plan.experiment
        return ok and per_step(r) > 0 and sc.key_of(r) is not None

    runs, on = earlier_runs(plan.results_dir, mine)
    walls: dict[tuple, list[float]] = {}
    for r in runs:
        n, m, c, _ = sc.key_of(r)
        for k in ((n, m, c), (n, m)):
            walls.setdefault(k, []).append(per_step(r))
    total, counted = plan.expected(walls)
    todo = len(plan.pending())
    if not counted:
        return f"expected time: unknown (no earlier scaling run of {plan.experiment} recorded)"
    left = f"; {todo - counted} run(s) of sizes never run before not counted" * (todo > counted)
    return (
        f"expected time: about {duration(total)} for {counted} run(s) to go (the median wall "
        f"time per step of earlier scaling runs of each size and method, {on}, and "
        f"{sc.SIZE_OVERHEAD_S:.0f} s a size for its profile and launch){left}"
    )


def _from_records(sweep_id: str, results_dir: str, status_only: bool) -> None:
    """``--status`` (what is recorded) or ``--aggregate`` (the table) of a sweep."""
    from bench.registry import ConfigError
    from bench.sweeps import scaling as sc
    from bench.sweeps import scaling_table as st
    from bench.sweeps.common import sweep_records

    try:
        doc = sc.read_plan(results_dir, sweep_id)
        plan = sc.load(results_dir, sweep_id)[0] if status_only or "topologies" in doc else None
    except ConfigError as e:
        fail(str(e))
    recs = sweep_records(results_dir, sweep_id)
    if status_only:
        how = f"launcher {plan.launcher}" if plan.launcher else "the run queue here"
        _sweep.print_status(
            f"sweep {plan.sweep_id}: cluster {plan.cluster}, {how}", [plan.progress(recs)]
        )
        return
    # a plan made before sweeps were resumable: every run is taken as done
    _report(st.build_table(recs, doc), plan, recs, results_dir, sweep_id)


def _run(plan, doc) -> None:
    from bench.sweeps import scaling as sc
    from bench.sweeps import scaling_table as st
    from bench.sweeps.common import run_queued, sweep_records

    results_dir = plan.results_dir
    if doc is None:  # every size's profile and every prediction, before any run
        with _sweep.checking_for(plan.launcher):
            doc = plan.prepare()
        for s in doc["sizes"]:
            print(f"size {s['nodes']}x{s['workers_per_node']}: {s['profile']}", flush=True)
        path = sc.write_plan(doc, results_dir, plan)
        print(f"plan (predictions before the runs): {path}", flush=True)
    todo = len(plan.pending())
    if todo < len(plan.jobs()):
        print(f"{todo} of {len(plan.jobs())} runs to go", flush=True)
    sweep_dir = Path(results_dir) / "hydra" / "scaling" / plan.sweep_id
    try:
        statuses = plan.run(sweep_dir, _sweep.runner(plan, run_queued))
    except KeyboardInterrupt:
        print(f"interrupted; go on with: {_sweep.again('scaling', plan)}", file=sys.stderr)
        sys.exit(130)
    failed = sum(rc != 0 for rc in statuses)
    recs = sweep_records(results_dir, plan.sweep_id)
    missing = _report(st.build_table(recs, doc), plan, recs, results_dir, plan.sweep_id)
    sys.exit(1 if failed or missing else 0)


def _report(table, plan, recs, results_dir: str, sweep_id: str) -> int:
    """Print and write the table (``partial/`` while runs are missing); the runs missing."""
    from bench.registry import ConfigError
    from bench.sweeps import scaling_table as st
    from bench.sweeps.resume import write_sweep_table

    missing = len(plan.pending(recs)) if plan is not None else 0
    try:
        path, _ = write_sweep_table(table, results_dir, "scaling", sweep_id, not missing)
    except ConfigError as e:
        fail(str(e), 1)
    print(st.format_table(table))
    for line in st.summary(table):
        print(line)
    if missing:
        print(f"missing: {plan.progress(recs)}", file=sys.stderr, flush=True)
    print(f"table: {path}" + (" (partial: runs are missing)" if missing else ""), flush=True)
    return missing
