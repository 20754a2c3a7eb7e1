"""What the sweep commands share: launcher submission; naming, resuming, checking a sweep."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

SWEEP_ID_MAX = 200  # bytes: with "-tuning.csv" or a temporary file's suffix, a file name


def sweep_id(text: str) -> str:
    """A sweep id, which names files (checked as a file name)."""
    n = len(text.encode())
    why = (
        "holds '/'" if "/" in text or "\0" in text
        else "is '.' or '..'" if text in (".", "..")
        else f"is {n} bytes long (at most {SWEEP_ID_MAX})" if n > SWEEP_ID_MAX
        else ""
    )  # fmt: skip
    if why:
        raise argparse.ArgumentTypeError(f"sweep id {text[:40]!r} {why}: it names files")
    return text


def add_options(ap: argparse.ArgumentParser, rerun_failed: bool = True) -> None:
    ap.add_argument(
        "--launcher",
        metavar="NAME",
        default="",
        help="submit each job through this Hydra launcher (slurm: conf/hydra/launcher/"
        "slurm.yaml; submitit_local; hydra/launcher=NAME works too) instead of running "
        "the jobs here; hydra.launcher.KEY=VALUE overrides go to it",
    )
    ap.add_argument("--sweep-id", metavar="ID", default="",
                    help="name the sweep; the same command again resumes it")  # fmt: skip
    ap.add_argument("--resume", metavar="SWEEP_ID", help="go on with a sweep: only the "
                    "jobs without a record (or interrupted) are run")  # fmt: skip
    ap.add_argument("--status", metavar="SWEEP_ID", help="what is recorded and what is not")
    if rerun_failed:
        ap.add_argument(
            "--rerun-failed",
            action="store_true",
            help="with a resumed sweep, run the failed (error) jobs again too",
        )
        ap.add_argument(
            "--rerun",
            metavar="RUN_IDS",
            type=run_ids,
            default=(),
            help="with a resumed sweep, run the jobs of these recorded runs again "
            "(comma-separated run ids: runs disturbed by other work on the machine, say); "
            "their records stay, the new ones count",
        )
    for a in ap._actions:  # the command's own --aggregate too
        if a.dest in ("sweep_id", "resume", "status", "aggregate"):
            a.type = sweep_id


def launcher_of(args: argparse.Namespace) -> tuple[list[str], list[str], str]:
    """(the jobs' overrides, the hydra.* overrides, the launcher name or "")."""
    from bench.launch.submit import check_launcher, split_overrides
    from bench.registry import ConfigError

    jobs, hydra, choice = split_overrides(args.overrides)
    name = args.launcher or choice
    if args.launcher and choice and choice != args.launcher:
        raise ConfigError(f"--launcher {args.launcher} and hydra/launcher={choice} differ")
    if hydra and not name and any(o.startswith("hydra.launcher.") for o in hydra):
        raise ConfigError("hydra.launcher.* overrides need a launcher (--launcher slurm)")
    if name:
        check_launcher(name)
    return jobs, hydra, name


def refuse_plan_options(
    args: argparse.Namespace, parser: argparse.ArgumentParser, shaping: Sequence[str],
    jobs: Sequence[str],
) -> None:  # fmt: skip
    """ConfigError for what ``--resume`` would ignore: a ``shaping`` option or override."""
    from bench.registry import ConfigError

    if not args.resume:
        return
    given = [f"--{d.replace('_', '-')}" for d in shaping
             if getattr(args, d, None) != parser.get_default(d)]  # fmt: skip
    given += [f"override {o}" for o in jobs]
    if given:
        raise ConfigError(
            f"--resume {args.resume} runs the sweep's saved plan, so {', '.join(given)} "
            f"would be ignored: drop them, or give --sweep-id {args.resume} with the "
            "command that made the sweep (it is checked against the plan)"
        )


def default_cluster(given: str | None, launcher: str, here: str) -> str:
    """``--cluster`` as given; else multinode on Slurm, local under the local executor,
    ``here`` without a launcher."""
    if given:
        return given
    if not launcher:
        return here
    from bench.launch.submit import is_slurm

    return "multinode" if is_slurm(launcher) else "local"


@contextlib.contextmanager
def checking_for(launcher: str) -> Iterator[None]:
    """For a Slurm launcher, ``node0:29500`` stands in for the rendezvous endpoint each job
    sets, while the jobs are checked here."""
    from bench.launch.submit import is_slurm

    key = "BENCH_RDZV_ENDPOINT"
    if not launcher or not is_slurm(launcher) or key in os.environ:
        yield
        return
    os.environ[key] = "node0:29500"
    try:
        yield
    finally:
        os.environ.pop(key, None)


def use_launcher(plan: Any, launcher: str, hydra: Sequence[str]) -> None:
    """The launcher given now, else the one the plan was submitted through."""
    if launcher:
        plan.launcher, plan.launcher_overrides = launcher, list(hydra)


def check_launch(plan: Any, jobs: Sequence[Sequence[str]]) -> None:
    """Compose the launcher's config of every allocation before anything is submitted."""
    if not plan.launcher or not jobs:
        return
    from bench.launch.submit import check_groups
    from bench.sweeps.common import compose_all

    check_groups(plan.launcher, plan.launcher_overrides, compose_all(jobs))


def runner(plan: Any, local: Callable[..., list[int]]) -> Callable[..., list[int]]:
    """``local`` without a launcher; else each batch of jobs submitted through it."""
    if not plan.launcher:
        return local
    from bench.launch.submit import submit
    from bench.sweeps.common import compose_all, job_label
    from reproduce.train import task

    def run(jobs: list[list[str]], sweep_dir: Path, experiment: str) -> list[int]:  # noqa: ARG001
        if not jobs:
            return []
        return submit(jobs, compose_all(jobs), launcher=plan.launcher,
                      hydra_overrides=plan.launcher_overrides, sweep_dir=sweep_dir,
                      task=task, labels=[job_label(j) for j in jobs])  # fmt: skip

    return run


# bench.results.records.RUN_ID_FORM, not imported: it loads pandas (a test holds the two)
RUN_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")


def run_ids(text: str) -> tuple[str, ...]:
    """``--rerun``'s comma-separated run ids (``20261203-235201-288a60``)."""
    ids = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in ids if not RUN_ID.match(x)]
    if bad or not ids:
        raise argparse.ArgumentTypeError(
            f"not a run id: {bad[0] if bad else repr(text)} (a run id reads 20261203-235201-288a60)"
        )
    return ids


def rerun_of(args: argparse.Namespace) -> tuple[str, ...]:
    """The statuses whose jobs run again, and ``--rerun``'s run ids."""
    from bench.sweeps.resume import RERUN, RERUN_FAILED

    return (*(RERUN_FAILED if args.rerun_failed else RERUN), *getattr(args, "rerun", ()))


def again(command: str, plan: Any) -> str:
    """The line that goes on with ``plan``'s sweep."""
    return (
        f"python -m reproduce {command} --resume {plan.sweep_id} "
        f"--results-dir {shlex.quote(str(plan.results_dir))}"
    )


@contextlib.contextmanager
def full_disk(command: str, plan: Any, then: str = " --rerun-failed") -> Iterator[None]:
    """A full disk ends the sweep in one line, with the command that finishes it, exit 1."""
    from bench.results.reserve import no_space

    try:
        yield
    except OSError as e:
        line = no_space(e, plan.results_dir)
        if line is None:
            raise
        print(f"error: {line}; free space, then: {again(command, plan)}{then}",
              file=sys.stderr, flush=True)  # fmt: skip
        sys.exit(1)


def print_status(head: str, lines: Sequence[str]) -> None:
    print(head)
    for line in lines:
        print(f"  {line}")
    sys.stdout.flush()
