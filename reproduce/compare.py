"""``python -m reproduce compare RUN_ID [RUN_ID ...] --out PNG [--label KEY]``

Accuracy curves of recorded runs side by side (per epoch and against training time),
drawn from the records (``runs.jsonl``) and the curve CSVs alone, with each run's time to
target printed as a table.  Each run id is looked up in the ``--results-dir`` directories
in order (by default a user's ``runs/`` and then the committed reference ``results/``),
so that a user's run compares with a reference one by naming both.
"""

from __future__ import annotations

import sys

from reproduce._cli import REFERENCE, RESULTS, Parser

USAGE = """compare RUN_ID... --out PNG [--dry-run]
                          accuracy curves of recorded runs side by side"""


def main(argv: list[str]) -> None:
    from bench.results import records
    from bench.results.plots import plot_time_to_accuracy

    ap = Parser(
        "compare",
        summary="Draws the accuracy curves of recorded runs side by side and prints their "
        "times to target; a user's runs and the reference ones compare by run id.",
        example="python -m reproduce compare <your run id> 20261130-222143-510ca9 --out cmp.png",
        details=__doc__,
    )
    ap.add_argument("run_ids", nargs="+")
    ap.add_argument(
        "--out", required=True, help="PNG to write (refuses to replace an existing file)"
    )
    ap.add_argument(
        "--results-dir",
        action="append",
        help=f"where to look for the runs, repeatable, in order (default: {RESULTS}, "
        f"then {REFERENCE})",
    )
    ap.add_argument(
        "--label", default="comm", help="record field(s) naming each run, comma-separated"
    )
    ap.add_argument("--title", default="")
    ap.add_argument("--dry-run", action="store_true", help="say what would be drawn; write nothing")
    args = ap.parse_args(argv)
    from pathlib import Path

    if Path(args.out).exists():
        print(f"error: {args.out} exists; choose another --out", file=sys.stderr)
        sys.exit(2)
    dirs = args.results_dir or [RESULTS, REFERENCE]
    runs, recs = [], []
    for rid in args.run_ids:
        found = [(d, r) for d in dirs if (r := records.find_record(d, rid)) is not None]
        if not found:
            where = ", ".join(str(records.runs_path(d)) for d in dirs)
            print(f"error: no record {rid!r} in {where}", file=sys.stderr)
            sys.exit(2)
        where, rec = found[0]
        if not records.curve_path(where, rid).is_file():
            why = "; ".join(str(v) for v in (rec.get("status"), rec.get("reason")) if v)
            print(f"error: run {rid} has no curve to draw (it ended {why})", file=sys.stderr)
            sys.exit(2)
        label = " ".join(str(rec.get(k)) for k in args.label.split(","))
        runs.append((label, records.load_curve(where, rid)))
        recs.append(rec)
    metric, target = recs[0]["target_metric"], recs[0]["target_value"]
    if any((r["target_metric"], r["target_value"]) != (metric, target) for r in recs):
        print("error: the runs have different targets", file=sys.stderr)
        sys.exit(2)
    if args.dry_run:
        for (label, curve), r in zip(runs, recs):
            print(f"{r['run_id']}: {label!r}, {len(curve)} epoch(s), {r.get('hardware', '')}")
        print(f"would draw {args.out} ({metric} >= {target}); nothing written (--dry-run)")
        return
    title = args.title or f"{recs[0]['experiment']}: {metric} >= {100 * target:g} %"
    hw = sorted({r.get("hardware", "") for r in recs})
    plot_time_to_accuracy(
        runs,
        metric=metric,
        target=target,
        path=args.out,
        title=title,
        hardware="; ".join(hw),
        per_epoch=True,
    )
    print(
        f"{'label':<24} {'status':<14} {'time_to_target_s':>16} {'epochs':>6} {'train_time_s':>12}"
    )
    for (label, _), r in zip(runs, recs):
        tt = r.get("time_to_target_s")
        print(
            f"{label:<24} {r['status']:<14} {tt if tt is None else round(tt, 1)!s:>16} "
            f"{r.get('epochs_to_target')!s:>6} {round(r.get('train_time_s') or 0, 1):>12}"
        )
    print(f"figure: {args.out}")
