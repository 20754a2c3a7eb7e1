"""``python -m reproduce figures [--results-dir DIR] [--reference REF] [--experiment NAME]
[--dry-run] [--verbose]``

Every figure (``DIR/figures/``), ``DIR/REPORT.md`` and ``DIR/REPORT-appendix.md`` from the
records, curves and benchmark CSVs of ``DIR`` alone: nothing is trained or measured.
``--reference results`` draws a user's runs beside the reference ones: both directories'
inputs are copied into ``DIR/with-reference/``, where the figures and report are made.
``--experiment NAME`` draws that experiment's figures only.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

from reproduce._cli import REFERENCE, RESULTS, Parser, fail

USAGE = """figures [--results-dir DIR] [--reference REF] [--experiment NAME] [--dry-run]
                          every figure and DIR/REPORT.md from the records and CSVs alone"""

# how bench.results.columns.older_records words a set of older records ("12 record(s) written
# before the fields ... existed"); worded otherwise, they are printed one line each
OLDER = re.compile(r"^(\d+) record\(s\) written before the fields")


def _args(argv: list[str]) -> argparse.Namespace:
    ap = Parser(
        "figures",
        summary="Draws every figure and writes REPORT.md from the records, curves and "
        "benchmark CSVs of a results directory alone; nothing is trained or measured.",
        example=f"python -m reproduce figures --results-dir {RESULTS} --reference {REFERENCE}",
        details=__doc__,
    )
    ap.results_dir(
        f"records, curves/, bench/ (default {RESULTS}, a user's runs; the committed "
        f"reference results: {REFERENCE})"
    )
    ap.add_argument(
        "--reference",
        metavar="REF",
        help=f"also draw REF's records beside DIR's (e.g. {REFERENCE}); the figures and "
        "report go to DIR/with-reference/",
    )
    ap.add_argument(
        "--experiment", action="append", help="only this experiment's figures (repeatable)"
    )
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="list the inputs found and the figures it would write",
    )
    ap.add_argument(
        "-v", "--verbose", action="store_true", help="name every record of an older format"
    )
    return ap.parse_args(argv)


def with_reference(results_dir: str, reference: str, out: Path | None = None) -> Path:
    """``results_dir/with-reference/`` (or ``out``): the reference's inputs, then the user's
    (whose CSV of the same name wins), copied into one directory."""
    src = [Path(reference), Path(results_dir)]
    for d in src:
        if not d.is_dir():
            fail(
                f"{d} is not a directory (no runs yet? `python -m reproduce dawnbench` makes "
                f"some in {RESULTS}/)"
            )
    out = out or Path(results_dir) / "with-reference"
    lines: list[bytes] = []
    for d in src:
        runs = d / "runs.jsonl"
        if runs.is_file():
            text = runs.read_bytes()  # as it is: a line that is not a record is skipped later
            lines.append(text if text.endswith(b"\n") or not text else text + b"\n")
        for sub in ("curves", "bench", "ablation", "scaling"):
            if (d / sub).is_dir() and (d / sub).resolve() != (out / sub).resolve():
                shutil.copytree(
                    d / sub, out / sub, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.lock")
                )
    out.mkdir(parents=True, exist_ok=True)
    (out / "runs.jsonl").write_bytes(b"".join(lines))
    return out


def _check_experiments(names: list[str] | None, recorded: set[str]) -> None:
    from bench.report.commands import known_experiments

    known = set(known_experiments()) | recorded
    bad = [n for n in names or [] if n not in known]
    if bad:
        fail(
            f"unknown experiment {', '.join(bad)}; known: {', '.join(sorted(known))} "
            "(conf/experiment/*.yaml and the records)"
        )


def _load(results_dir: str):
    from bench.report.tables import NoRecords, load_inputs

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # load_inputs keeps each warning as a problem
            inputs = load_inputs(results_dir)
    except NoRecords as e:
        if Path(results_dir).exists() and not Path(results_dir).is_dir():
            fail(
                f"{results_dir} is a file, not a results directory: point --results-dir at a "
                f"directory with records (a user's runs: {RESULTS}; the committed reference "
                f"results: {REFERENCE})"
            )
        fail(
            f"{e}: run a training first, e.g. `python -m reproduce dawnbench "
            f"results.dir={results_dir}`, or point --results-dir at a directory with records "
            f"(the committed reference results: --results-dir {REFERENCE})"
        )
    return inputs


def _problems(problems: list[str], verbose: bool) -> None:
    """Each input problem on one line; the records of older formats in one (``--verbose``:
    each)."""
    older = [p for p in problems if OLDER.match(p)]
    for p in problems:
        if p not in older:
            print(f"warning: {p}", file=sys.stderr)
    if not older:
        return
    n = sum(int(OLDER.match(p).group(1)) for p in older)  # type: ignore[union-attr]
    if verbose:
        for p in older:
            print(f"note: {p}", file=sys.stderr)
    else:
        print(
            f"note: {n} record(s) of older formats, read with their later fields absent "
            "(--verbose names them)",
            file=sys.stderr,
        )


def _yours(args: argparse.Namespace) -> set[str]:
    """With ``--reference``: the run ids of the user's own runs (drawn on their own)."""
    from bench.results.records import load_records

    if not args.reference:
        return set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn line: reported when the merged copy is read
        return {str(r.get("run_id")) for r in load_records(args.results_dir)}


def _listing(inputs, figs: list, moved: tuple[Path, Path] | None) -> None:
    """The dry run's listing; ``moved``: (the temporary copy, where the real run writes)."""

    def where(p: Path) -> Path:
        return moved[1] / Path(p).relative_to(moved[0]) if moved else Path(p)

    print(
        f"inputs in {where(inputs.results_dir)}: {len(inputs.records)} record(s) in runs.jsonl, "
        f"{int(inputs.runs['has_curve'].sum())} curve(s) in curves/"
    )
    print(f"  benchmark CSVs: {', '.join(p.name for p in inputs.bench.values()) or 'none'}")
    print(
        f"  ablation CSVs: {', '.join(p.name for p in inputs.ablation) or 'none'}; "
        f"scaling CSVs: {', '.join(p.name for p in inputs.scaling) or 'none'}"
    )
    print(f"would write {len(figs)} figure(s):")
    for f in figs:
        print(f"  {where(f.path)}: {f.what}")
    report = where(inputs.results_dir / "REPORT.md")
    print(f"and {report}; nothing written (--dry-run)")


def main(argv: list[str]) -> None:
    args = _args(argv)
    src, moved = args.results_dir, None
    with tempfile.TemporaryDirectory() as tmp:  # a dry run merges into it: nothing written
        if args.reference and args.dry_run:
            dest = Path(args.results_dir) / "with-reference"
            print(f"would copy the inputs of {args.reference} and {args.results_dir} into {dest}")
            merged = with_reference(args.results_dir, args.reference, Path(tmp) / dest.name)
            src, moved = merged, (merged, dest)
        elif args.reference:
            src = with_reference(args.results_dir, args.reference)
        inputs = _load(str(src))
        _check_experiments(args.experiment, set(inputs.runs["experiment"]))
        from bench.report.answer import write_report
        from bench.report.figures import draw, plan

        figs = plan(inputs, args.experiment, _yours(args))
        _problems(inputs.problems, args.verbose)
        if args.dry_run:
            _listing(inputs, figs, moved)
            return
    report = inputs.results_dir / "REPORT.md"
    for d in [report.parent, *{f.path.parent for f in figs}]:  # one line, not a traceback
        try:
            d.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=d):
                pass
        except OSError as e:
            fail(f"{d} is not writable ({e.strerror}); nothing was drawn")
    with warnings.catch_warnings():
        # matplotlib's and pandas' notes say nothing of the results (each figure's: below)
        warnings.simplefilter("ignore")
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
