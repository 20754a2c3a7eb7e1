"""``python -m reproduce compare RUN_ID [RUN_ID ...] --out PNG [--label KEY]``

Accuracy curves of recorded runs side by side (per epoch and against training time),
drawn from ``results/runs.jsonl`` and the curve CSVs alone, with each run's time to
target printed as a table.
"""

from __future__ import annotations

import argparse
import sys

USAGE = """compare RUN_ID... --out PNG [--dry-run]
                          accuracy curves of recorded runs side by side"""


def main(argv: list[str]) -> None:
    from bench.results import records
    from bench.results.plots import plot_comparison

    ap = argparse.ArgumentParser(prog="python -m reproduce compare")
    ap.add_argument("run_ids", nargs="+")
    ap.add_argument(
        "--out", required=True, help="PNG to write (refuses to replace an existing file)"
    )
    ap.add_argument("--results-dir", default="results")
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
    runs, recs = [], []
    for rid in args.run_ids:
        rec = records.find_record(args.results_dir, rid)
        if rec is None:
            print(
                f"error: no record {rid!r} in {records.runs_path(args.results_dir)}",
                file=sys.stderr,
            )
            sys.exit(2)
        label = " ".join(str(rec.get(k)) for k in args.label.split(","))
        runs.append((label, records.load_curve(args.results_dir, rid)))
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
    plot_comparison(
        runs, metric=metric, target=target, path=args.out, title=title, hardware="; ".join(hw)
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
