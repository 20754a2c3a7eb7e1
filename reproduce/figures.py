"""``python -m reproduce figures [--results-dir DIR] [--experiment NAME] [--dry-run]``

Every figure of the reproduction, and ``DIR/REPORT.md``, regenerated from the records
(``DIR/runs.jsonl``), curves (``DIR/curves/``) and benchmark CSVs (``DIR/bench/*.csv``)
alone: nothing is trained or measured.  Figures go to ``DIR/figures/``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import warnings

USAGE = """figures [--results-dir DIR] [--experiment NAME] [--dry-run]
                          every figure and DIR/REPORT.md from the records and CSVs alone"""


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def _args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m reproduce figures")
    ap.add_argument(
        "--results-dir", default="results", help="records, curves/, bench/ (default results)"
    )
    ap.add_argument(
        "--experiment", action="append", help="only this experiment's figures (repeatable)"
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="list the inputs found and the figures it would write",
    )
    return ap.parse_args(argv)


def _check_experiments(names: list[str] | None, recorded: set[str]) -> None:
    from bench.report.report_commands import known_experiments

    known = set(known_experiments()) | recorded
    bad = [n for n in names or [] if n not in known]
    if bad:
        _fail(
            f"unknown experiment {', '.join(bad)}; known: {', '.join(sorted(known))} "
            "(conf/experiment/*.yaml and the records)"
        )


def _load(results_dir: str):
    from bench.report.figures_data import NoRecords, load_inputs

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # load_inputs keeps each warning as a problem
            inputs = load_inputs(results_dir)
    except NoRecords as e:
        _fail(
            f"{e}: run a training first, e.g. `python -m reproduce dawnbench "
            f"results.dir={results_dir}`, or point --results-dir at a directory with records"
        )
    return inputs


def _print_inputs(inputs) -> None:
    d = inputs.results_dir
    print(
        f"inputs in {d}: {len(inputs.records)} record(s) in runs.jsonl, "
        f"{int(inputs.runs['has_curve'].sum())} curve(s) in curves/"
    )
    print(f"  benchmark CSVs: {', '.join(p.name for p in inputs.bench.values()) or 'none'}")
    print(
        f"  ablation CSVs: {', '.join(p.name for p in inputs.ablation) or 'none'}; "
        f"scaling CSVs: {', '.join(p.name for p in inputs.scaling) or 'none'}"
    )


def _check_writable(folders: list) -> None:
    """One line before anything is drawn, rather than a traceback at the first write."""
    import tempfile

    for d in folders:
        try:
            d.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=d):
                pass
        except OSError as e:
            _fail(f"{d} is not writable ({e.strerror}); nothing was drawn")


def main(argv: list[str]) -> None:
    args = _args(argv)
    inputs = _load(args.results_dir)
    _check_experiments(args.experiment, set(inputs.runs["experiment"]))
    from bench.report.figures_plan import draw, plan
    from bench.report.report import write_report

    figs = plan(inputs, args.experiment)
    for p in inputs.problems:
        print(f"warning: {p}", file=sys.stderr)
    report = inputs.results_dir / "REPORT.md"
    if args.dry_run:
        _print_inputs(inputs)
        print(f"would write {len(figs)} figure(s):")
        for f in figs:
            print(f"  {f.path}: {f.what}")
        print(f"and {report}; nothing written (--dry-run)")
        return
    _check_writable([report.parent, *{f.path.parent for f in figs}])
    draw(figs)
    for f in figs:
        state = "written" if f.drawn else f"not drawn ({f.error or 'nothing to draw'})"
        print(f"{f.path}: {state}")
    when = _dt.datetime.now().astimezone().isoformat(timespec="seconds")
    cmd = " ".join(["python -m reproduce figures", *argv])
    header = (
        f"Made by `{cmd}` on {when} from {len(inputs.records)} record(s), their curves and "
        f"{len(inputs.bench)} benchmark CSV(s) in `{inputs.results_dir}`; nothing was trained "
        "or measured to write it."
    )
    write_report(inputs, figs, report, header)
    print(f"report: {report}")
