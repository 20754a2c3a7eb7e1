"""``python -m reproduce gpucheck [--budget-s 480] [--dry-run] [--results-dir DIR]``."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from reproduce._cli import RESULTS, Parser, did_you_mean, fail

USAGE = """gpucheck [--budget-s 480] [--dry-run] [--cpu] [--call --wheels DIR --archive FILE]
                          every CUDA path, measured within a time budget (see docs/gpu.md)"""


def install(wheels: list[Path]) -> str:
    """Install ``wheels`` (no index, no dependencies) into a temporary folder put first on
    this process's path and on every step's (PYTHONPATH); returns the folder."""
    site = tempfile.mkdtemp(prefix="gpucheck-site-")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--target", site, *map(str, wheels)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        why = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
        fail(f"installing {len(wheels)} wheels failed: {why}")
    sys.path.insert(0, site)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)
    print(f"installed {', '.join(w.name.split('-')[0] for w in wheels)} into {site}")
    return site


def archive(results_dir: str, path: str) -> None:
    """``results_dir`` as one ``.tar.gz`` (a device call brings back a few files only)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        tar.add(results_dir, arcname=Path(results_dir).name)
    print(f"results archived: {path} ({Path(path).stat().st_size / 2**20:.1f} MiB)")


def main(argv: list[str]) -> None:
    from bench.gpucheck.check import DEVICE_CALL, STEPS, check, probe

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
    ap.add_argument("--call", action="store_true",
                    help=f"the prepared device call's steps: {','.join(DEVICE_CALL)}")  # fmt: skip
    ap.add_argument("--wheels", default="", help="install this folder's wheels first (no "
                    "index, no dependencies) for the check and its steps: Hydra's")  # fmt: skip
    ap.add_argument("--archive", default="", help="write the results directory to this "
                    ".tar.gz at the end")  # fmt: skip
    args = ap.parse_args(argv)
    if args.budget_s <= 0:
        fail(f"--budget-s must be > 0, got {args.budget_s:g}")
    if args.call and args.only:
        fail("--call runs its own steps; leave out --only")
    known = [s.name for s in STEPS]
    names = list(DEVICE_CALL) if args.call else [n.strip() for n in args.only.split(",") if n]
    if unknown := [n for n in names if n not in known]:
        hint = did_you_mean(unknown[0], known)
        fail(f"unknown step(s) {', '.join(unknown)}; choose from {', '.join(known)}{hint}")
    steps = tuple(s for s in STEPS if s.name in names) if names else STEPS
    wheels = sorted(Path(args.wheels).glob("*.whl")) if args.wheels else []
    if args.wheels and not wheels:
        fail(f"--wheels {args.wheels}: no .whl files there (build them as docs/gpu.md says)")
    if wheels and args.dry_run:
        print(f"would install {len(wheels)} wheels: {', '.join(w.name for w in wheels)}")
    elif wheels:
        install(wheels)
    info = probe()
    if not (info["cuda"] or args.cpu or args.dry_run):
        fail("no CUDA device on this machine: gpucheck measures a GPU (--cpu runs the "
              "steps' CPU modes, --dry-run prints the plan)")  # fmt: skip
    outcomes = check(args.results_dir, args.budget_s, args.dry_run, steps, info, args.cpu)
    if args.archive and not args.dry_run:
        archive(args.results_dir, args.archive)
    bad = [o for o in outcomes if o.status in ("failed", "timeout")]
    sys.exit(1 if bad else 0)
