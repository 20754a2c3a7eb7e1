"""python -m reproduce <command> [args]: train, benchmark, sweep and report the
reproduction; `python -m reproduce <command> --help` says what each command does.

  --version               the package's version and git commit

commands:
  train [overrides]       one training run (Hydra overrides; -m for a multirun sweep)
  train resume=RUN_ID [results.dir=DIR] [train.epochs=N ...]
                          continue a stopped, interrupted or killed run from its last
                          checkpoint, into the same run id (also: dawnbench resume=RUN_ID)
  train|dawnbench --dry-run [--verbose] [overrides]
                          the checks a run makes and its plan (what, where, how long);
                          --verbose adds the resolved config; nothing run
  dawnbench [overrides]   the DAWNBench-style time-to-accuracy recipe for the chosen data
                          (digits by default; data=cifar10|imagenet data.root=... for the real ones;
                          data=translation: a Transformer on the embedded corpus or data.root=...)
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from reproduce._cli import (
    REFERENCE,
    RESULTS,
    SYNONYMS,
    did_you_mean,
    fail,
    flags_to_overrides,
    unquoted,
)

DAWNBENCH = {
    "digits": "dawnbench_digits",
    "cifar10": "dawnbench_cifar10",
    "imagenet": "dawnbench_imagenet",
    "translation": "transformer_embedded",
}

# the flags of the Hydra commands: ours, then Hydra's own (passed to Hydra)
OUR_FLAGS = ("--dry-run", "-v", "--verbose")
HYDRA_FLAGS = (
    "-m", "--multirun", "--hydra-help", "--cfg", "-c", "--resolve", "--package", "-p",
    "--info", "-i", "--shell-completion", "-sc", "--config-path", "-cp", "--config-name",
    "-cn", "--config-dir", "-cd", "--experimental-rerun",
)  # fmt: skip
CONF = Path(__file__).resolve().parents[1] / "conf"


# a group's option that is not a training method says so in its file (comm=nocomm)
MEASUREMENT = "A measurement device, not a training method"
# the flags the help offers (a misspelt flag is told the closest of these only)
HELP_FLAGS = (*OUR_FLAGS, "-m", "--multirun", "--hydra-help")


def _train_help(cmd: str) -> str:
    groups = ""  # each config group of conf/ and the options a user chooses from
    for d in (d for d in sorted(CONF.iterdir()) if d.is_dir() and d.name != "hydra"):
        opts = sorted(p.stem for p in d.glob("*.yaml") if MEASUREMENT not in p.read_text())
        groups += f"\n  {d.name}={'|'.join(opts)}"
    what = (
        "train: one training run: trains the model, evaluates it every epoch and records\n"
        "the run (record, curve, plot, DAWNBench files, MLPerf log); configured by conf/\n"
        "and key=value overrides."
        if cmd == "train"
        else "dawnbench: the DAWNBench-style time-to-accuracy recipe for the chosen data set\n"
        f"({', '.join(f'data={d}' for d in DAWNBENCH)}), trained and recorded as by train."
    )
    example = (
        "python -m reproduce train comm=hitopk cluster.nnodes=2 train.epochs=5"
        if cmd == "train"
        else "python -m reproduce dawnbench --dry-run   (then without --dry-run)"
    )
    return f"""{what}

usage: python -m reproduce {cmd} [--dry-run [--verbose]] [key=value ...]
       python -m reproduce {cmd} -m key=a,b ...     (a sweep: one run per combination)
       python -m reproduce {cmd} resume=RUN_ID [results.dir=DIR]

config groups (group=option):{groups}

main keys (key=value; any key of the resolved config, see --dry-run --verbose):
  results.dir=DIR          where the record and its files go (default {RESULTS}/, git-ignored;
                           results.dir={REFERENCE} writes the committed reference results)
  train.epochs=N  train.target_value=F  train.seed=N  optim.lr=F  data.batch_size=N
  data.root=DIR            the data set (cifar10, imagenet, translation files)
  cluster.nnodes=N  cluster.nproc_per_node=N   nodes x workers per node

flags:
  --dry-run                the checks a real run makes, and its plan; nothing run
  -v, --verbose            with --dry-run: the resolved config in full
  --results-dir DIR        the same as results.dir=DIR (also --experiment, --cluster)
  -m, --multirun           a sweep over comma-separated values
  --hydra-help             Hydra's own help

example:
  {example}
"""


def _precheck(overrides: list[str]) -> Any:
    """Compose the run's config (each job's, for ``-m``) with Hydra's errors as one line; the
    single run's config (None for a sweep, or with Hydra's own flags)."""
    from reproduce._dryrun import FLAGS, compose, refusal, sweep_jobs

    flags = [o for o in overrides if o.startswith("-")]
    if any(f not in FLAGS for f in flags):
        return None  # Hydra's own flags (--cfg, --info, ...): Hydra reports its own errors
    args = [o for o in overrides if not o.startswith(("-", "hydra.", "hydra/"))]
    for job in sweep_jobs(args) if flags else [args]:
        cfg = compose(job)
        if flags and "${" in os.path.abspath(str(cfg.results.dir)):
            fail(f"results.dir={cfg.results.dir!r} holds '${{', which Hydra reads back as an "
                 "interpolation in a multirun's folders: name another folder for -m")  # fmt: skip
        # a single run's checks before Hydra makes its folder: a refused run leaves nothing
        # (a sweep's refused job is recorded as such and the others go on)
        why = None if flags else refusal(cfg)
        if why:
            fail(why)
    if flags:
        return None
    import reproduce.train

    reproduce.train.PRECHECKED = True
    return cfg


def _hydra(overrides: list[str]) -> None:
    if any(o.startswith("resume=") and not o[7:].strip(" '\"") for o in overrides):
        fail(
            "resume= needs the id of the run to continue: resume=RUN_ID (each run's id is in "
            "its closing lines and in its results directory's runs.jsonl)"
        )
    if "--dry-run" in overrides:
        from reproduce._dryrun import dry_run

        dry_run([o for o in overrides if o != "--dry-run"])
        return
    if any(o.startswith("resume=") for o in overrides):  # the checkpoint's config, not Hydra's
        from bench.launch.run import resume
        from bench.registry import ConfigError

        run_id = next(o.split("=", 1)[1] for o in overrides if o.startswith("resume="))
        skip = ("resume=", "experiment=", "data=")
        try:
            rc, _ = resume(run_id, unquoted([o for o in overrides if not o.startswith(skip)]))
        except ConfigError as e:
            fail(str(e))
        sys.exit(rc)
    verbose = any(o in ("-v", "--verbose") for o in overrides)
    overrides = [o for o in overrides if o not in ("-v", "--verbose")]
    cfg = _precheck(overrides)
    if verbose and cfg is not None:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(cfg, resolve=True), end="", flush=True)
    if cfg is not None and "${" in os.path.abspath(str(cfg.results.dir)):
        from reproduce.train import outside_hydra

        outside_hydra(cfg, overrides)  # Hydra's run folder cannot take this path
        return
    from reproduce.train import app

    sys.argv = [sys.argv[0], *overrides]
    app()


def _command_names() -> list[str]:
    """This package's modules that may be commands, unimported (``gpucheck`` runs where
    Hydra and pandas are missing)."""
    import pkgutil

    import reproduce

    return [
        m.name
        for m in pkgutil.iter_modules(reproduce.__path__)
        if not m.name.startswith("_") and m.name != "train"
    ]


def _commands() -> dict[str, str]:
    """name -> USAGE of every command module (``reproduce/<name>.py`` with ``main(argv)``)."""
    mods = {n: importlib.import_module(f"reproduce.{n}") for n in _command_names()}
    return {n: m.USAGE for n, m in mods.items() if hasattr(m, "USAGE") and hasattr(m, "main")}


def version() -> str:
    """``reproduce <version> (git <sha>)``; the commit where there is one."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as pkg_version

    here = Path(__file__).resolve().parent
    try:
        v = pkg_version("topk-dawnbench")
    except PackageNotFoundError:  # a checkout not installed: pyproject.toml's version
        m = re.search(r'^version = "([^"]+)"', (here.parent / "pyproject.toml").read_text(), re.M)
        v = m.group(1) if m else "unknown"
    try:
        git = ["git", "-C", str(here), "rev-parse", "--short", "HEAD"]
        sha = subprocess.check_output(git, text=True, timeout=10, stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.SubprocessError):
        sha = ""
    return f"reproduce {v}" + (f" (git {sha})" if sha else "")


def main(argv: list[str]) -> None:
    if argv and argv[0] in ("--version", "-V"):
        print(version())
        sys.exit(0)
    if not argv or argv[0] in ("-h", "--help", "help"):
        extra = "".join(f"  {usage}\n" for usage in _commands().values())
        print(f"{__doc__.rstrip()}\n{extra}\nexample:\n  python -m reproduce dawnbench\n")
        sys.exit(0 if argv else 2)
    cmd, rest = argv[0], argv[1:]
    if cmd in ("train", "dawnbench"):
        if any(o in ("-h", "--help") for o in rest):
            print(_train_help(cmd), end="")
            sys.exit(0)
        rest = flags_to_overrides(rest)
        for o in rest:  # an unknown -flag: one error line, with the closest known flag
            if o.startswith("-") and o.split("=")[0] not in (*OUR_FLAGS, *HYDRA_FLAGS):
                hint = did_you_mean(o.split("=")[0], [*HELP_FLAGS, *SYNONYMS.values()])
                fail(f"{cmd}: unknown option {o}{hint}")
    if cmd == "train":
        _hydra(rest)
    elif cmd == "dawnbench":
        data = next((o.split("=", 1)[1] for o in rest if o.startswith("data=")), "digits")
        if data not in DAWNBENCH:
            fail(
                f"dawnbench has recipes for data={', '.join(DAWNBENCH)}; got data={data}"
                f"{did_you_mean(data, DAWNBENCH)}"
            )
        if not any(o.startswith("experiment=") for o in rest):
            rest = [
                f"experiment={DAWNBENCH[data]}",
                *[o for o in rest if not o.startswith("data=")],
            ]
        _hydra(rest)
    elif cmd in _command_names() and hasattr(
        mod := importlib.import_module(f"reproduce.{cmd}"), "main"
    ):
        mod.main(rest)
    else:
        names = ["train", "dawnbench", *sorted(_commands())]
        fail(
            f"unknown command {cmd!r}; choose one of: {', '.join(names)}{did_you_mean(cmd, names)}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
