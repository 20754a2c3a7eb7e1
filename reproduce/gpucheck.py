"""``python -m reproduce gpucheck [--budget-s 480] [--dry-run] [--results-dir DIR]``."""

from __future__ import annotations

import sys

from reproduce._cli import RESULTS, Parser, did_you_mean

USAGE = """gpucheck [--budget-s 480] [--dry-run] [--cpu]
                          every CUDA path, measured within a time budget (see README, GPU)"""


def main(argv: list[str]) -> None:
    from bench.gpucheck.check import STEPS, check

    ap = Parser(
        "gpucheck",
        summary="Exercises and measures every CUDA path of the suite within a time budget, "
        "one row per step in <results-dir>/bench/gpucheck.csv and a summary table.",
        example="python -m reproduce gpucheck --budget-s 480 --dry-run",
    )
    ap.add_argument(
        "--budget-s", type=float, default=480.0, help="seconds for all steps (default %(default)g)"
    )
    ap.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    ap.add_argument(
        "--cpu", action="store_true", help="the steps with a CPU mode, on the CPU (plumbing)"
    )
    ap.add_argument(
        "--results-dir", default=RESULTS, help=f"where CSVs and records go (default {RESULTS}/)"
    )
    ap.add_argument(
        "--only",
        default="",
        help=f"comma-separated steps to run (default all): {','.join(s.name for s in STEPS)}",
    )
    args = ap.parse_args(argv)
    if args.budget_s <= 0:
        print(f"error: --budget-s must be > 0, got {args.budget_s:g}", file=sys.stderr)
        sys.exit(2)
    steps = STEPS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in {s.name for s in STEPS}]
        if unknown:
            hint = did_you_mean(unknown[0], [s.name for s in STEPS])
            print(
                f"error: unknown step(s) {', '.join(unknown)}; "
                f"choose from {', '.join(s.name for s in STEPS)}{hint}",
                file=sys.stderr,
            )
            sys.exit(2)
        steps = tuple(s for s in STEPS if s.name in names)
    outcomes = check(args.results_dir, args.budget_s, args.dry_run, steps, cpu=args.cpu)
    bad = [o for o in outcomes if o.status in ("failed", "timeout")]
    sys.exit(1 if bad else 0)
