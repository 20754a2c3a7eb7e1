"""``python -m reproduce bench NAME [--quick] [--replot] [--results-dir DIR]``."""

from __future__ import annotations

import sys

from bench.results.paths import bench_csv
from reproduce._cli import REFERENCE, RESULTS, Parser, did_you_mean, fail

USAGE = """bench NAME [--quick] [--replot] [--results-dir DIR] [--dry-run]
                          a benchmark (see `python -m reproduce bench --list`)"""


def _settings(module) -> list[str]:
    """The module's upper-case constants of plain values (its sizes, cases, densities)."""
    out = []
    for k in sorted(vars(module)):
        v = getattr(module, k)
        if k.isupper() and isinstance(v, (int, float, str, tuple, list, dict)):
            text = repr(v)
            out.append(f"  {k} = {text if len(text) <= 120 else text[:117] + '...'}")
    return out


def _dry_run(name: str, spec, results_dir: str, quick: bool, replot: bool) -> None:
    """What ``bench NAME`` would do: the benchmark, its settings, where its rows would go."""
    module = sys.modules[spec.run.__module__]
    csv = bench_csv(results_dir, name)
    rows = len(csv.read_text().splitlines()) - 1 if csv.is_file() else 0
    doc = (module.__doc__ or name).strip().split("\n\n")[0]
    print(f"benchmark {name} ({module.__name__}): {doc}")
    if replot:
        print(f"would redraw {csv.with_suffix('.png')} from the newest run in {csv} ({rows} rows)")
    else:
        mode = "quick (tiny sizes)" if quick else "full"
        print(f"would measure, {mode}, and append its rows to {csv} ({rows} rows there now),")
        print(f"then draw {csv.with_suffix('.png')}; settings of the module:")
        print("\n".join(_settings(module)) or "  (none declared)")
    print("nothing run (--dry-run)")


def main(argv: list[str]) -> None:
    from bench.benchmarks import load_all
    from bench.benchmarks.harness import BenchRun
    from bench.registry import ConfigError

    registry = load_all()
    ap = Parser(
        "bench",
        summary="Runs one micro-benchmark (top-k selection, optimizer update, input "
        "pipeline, communication, cluster, throughput), appends its rows to "
        "<results-dir>/bench/NAME.csv and draws NAME.png.",
        example="python -m reproduce bench topk --quick",
        details="benchmarks: " + ", ".join(registry.names()),
    )
    ap.add_argument("name", nargs="?", help=f"one of: {', '.join(registry.names())}")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (seconds), for smoke tests")
    ap.add_argument(
        "--replot",
        action="store_true",
        help="measure nothing: redraw the figure from the newest run in the CSV",
    )
    ap.results_dir(
        f"where bench/<name>.csv and .png go (default {RESULTS}/; the committed ones: {REFERENCE})"
    )
    ap.add_argument("--list", action="store_true", help="list the benchmarks")
    ap.add_argument("--dry-run", action="store_true", help="say what would run; run nothing")
    args = ap.parse_args(argv)
    if args.list or not args.name:
        print("\n".join(registry.names()))
        sys.exit(0 if args.list else 2)
    if args.name not in registry.names():
        fail(
            f"bench: unknown benchmark {args.name!r}; choose one of: "
            f"{', '.join(registry.names())}{did_you_mean(args.name, registry.names())}"
        )
    try:
        spec = registry.get(args.name)
        if args.dry_run:
            _dry_run(args.name, spec, args.results_dir, args.quick, args.replot)
            return
        if args.replot:
            run = BenchRun.newest(args.name, args.results_dir)
            spec.replot(run)
            print(f"figure redrawn from run {run.bench_id} of {run.csv_path}: {run.png_path}")
            return
    except ConfigError as e:
        fail(str(e))
    path = spec.run(results_dir=args.results_dir, quick=args.quick)
    print(f"results appended to {path}")
