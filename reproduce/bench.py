"""``python -m reproduce bench NAME [--quick] [--replot] [--results-dir DIR]``."""

from __future__ import annotations

import argparse
import sys

USAGE = """bench NAME [--quick] [--replot] [--results-dir DIR]
                          a benchmark (see `python -m reproduce bench --list`)"""


def main(argv: list[str]) -> None:
    from bench.benchmarks import load_all
    from bench.benchmarks.harness import BenchRun
    from bench.registry import ConfigError

    registry = load_all()
    ap = argparse.ArgumentParser(prog="python -m reproduce bench")
    ap.add_argument("name", nargs="?", help=f"one of: {', '.join(registry.names())}")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (seconds), for smoke tests")
    ap.add_argument(
        "--replot",
        action="store_true",
        help="measure nothing: redraw the figure from the newest run in the CSV",
    )
    ap.add_argument("--results-dir", default="results", help="where bench/<name>.csv and .png go")
    ap.add_argument("--list", action="store_true", help="list the benchmarks")
    args = ap.parse_args(argv)
    if args.list or not args.name:
        print("\n".join(registry.names()))
        sys.exit(0 if args.list else 2)
    try:
        spec = registry.get(args.name)
        if args.replot:
            run = BenchRun.newest(args.name, args.results_dir)
            spec.replot(run)
            print(f"figure redrawn from run {run.bench_id} of {run.csv_path}: {run.png_path}")
            return
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    path = spec.run(results_dir=args.results_dir, quick=args.quick)
    print(f"results appended to {path}")
