"""``python -m reproduce bench NAME [--quick] [--results-dir DIR]``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> None:
    from bench.benchmarks import load_all

    registry = load_all()
    ap = argparse.ArgumentParser(prog="python -m reproduce bench")
    ap.add_argument("name", nargs="?", help=f"one of: {', '.join(registry.names())}")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (seconds), for smoke tests")
    ap.add_argument("--results-dir", default="results", help="where bench/<name>.csv and .png go")
    ap.add_argument("--list", action="store_true", help="list the benchmarks")
    args = ap.parse_args(argv)
    if args.list or not args.name:
        print("\n".join(registry.names()))
        sys.exit(0 if args.list else 2)
    if args.name not in registry:
        print(
            f"error: unknown benchmark {args.name!r}; choose one of: {', '.join(registry.names())}",
            file=sys.stderr,
        )
        sys.exit(2)
    path = registry.get(args.name)(results_dir=args.results_dir, quick=args.quick)
    print(f"results appended to {path}")
