"""``train --dry-run`` / ``dawnbench --dry-run``: the resolved config and what would run.

The config is composed as for a run (the same Hydra composition and the same validation
across groups), printed, and nothing is launched, recorded or written.  A ``-m`` sweep
lists its jobs, one line each.
"""

from __future__ import annotations

import sys
from typing import Any

FLAGS = ("-m", "--multirun")


def hydra_error(e: BaseException) -> str:
    """One line from a Hydra/OmegaConf error; a missing group option lists the known ones."""
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    msg = lines[0] if lines else type(e).__name__
    if "Available options in" in str(e):
        opts = [ln.strip() for ln in lines if ln.startswith("\t") and "provider=" not in ln]
        if opts:
            msg += f"; known: {', '.join(opts)}"
    cause = e.__cause__
    if cause is not None:
        c = [ln for ln in str(cause).splitlines() if ln.strip()]
        msg += f" ({c[0]})" if c else ""
    return msg


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def _compose(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from reproduce.train import CONF_DIR

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        _fail(hydra_error(e))


def _refusal(cfg: Any) -> str | None:
    """Why the run would be refused before its workers start, or None.  The run's own
    checks run against a scratch results directory (they create it); the real one is
    only checked for write permission, so that nothing is made there."""
    import os
    import tempfile
    from pathlib import Path

    from bench.config import to_object
    from bench.launch.run import validate
    from bench.registry import ConfigError

    obj = to_object(cfg)
    real = Path(str(obj.results.dir))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            obj.results.dir = tmp
            validate(obj)
    except ConfigError as e:
        return str(e)
    parent = next(p for p in [real, *real.absolute().parents] if p.exists())
    if not os.access(parent, os.W_OK):
        return f"results.dir={str(real)!r} is not writable ({parent} is not)"
    return None


def launch_line(cfg: Any) -> str:
    """World size, nodes, launcher and where the record would go."""
    from pathlib import Path

    c = cfg.cluster
    world = int(c.nnodes) * int(c.nproc_per_node)
    runs = Path(str(cfg.results.dir)) / "runs.jsonl"
    return (
        f"would launch: {world} worker(s) = {c.nnodes} node(s) x {c.nproc_per_node} "
        f"(cluster={c.name}), {cfg.model.name} on {cfg.data.name}, comm={cfg.comm.name}, "
        f"update={cfg.optim['update']}, to {cfg.train.target_metric} >= {cfg.train.target_value} "
        f"in <= {cfg.train.epochs} epochs; record appended to {runs}"
    )


def _jobs(overrides: list[str]) -> list[list[str]]:
    """The overrides of each job of a ``-m`` sweep, in Hydra's order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        _fail(hydra_error(e))
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def _resume(overrides: list[str]) -> None:
    from bench.results.records import find_record

    run_id = next(o.split("=", 1)[1] for o in overrides if o.startswith("resume="))
    results = next(
        (o.split("=", 1)[1] for o in overrides if o.startswith("results.dir=")), "results"
    )
    rec = find_record(results, run_id)
    if rec is None:
        _fail(f"no record {run_id!r} in {results}/runs.jsonl")
    print(f"would resume run {run_id} ({rec.get('status')}, {rec.get('epochs_run')} epoch(s))")
    print(f"from its last checkpoint {rec.get('checkpoint')}; record appended to {results}")


def dry_run(overrides: list[str]) -> None:
    """Print what ``train <overrides>`` would run, and run nothing."""
    from omegaconf import OmegaConf

    if any(o.startswith("resume=") for o in overrides):
        _resume(overrides)
        return
    ignored = [o for o in overrides if o.startswith("-") and o not in FLAGS]
    if ignored:
        print(f"(ignored with --dry-run: {' '.join(ignored)})")
    args = [o for o in overrides if not o.startswith("-")]
    hydra_args = [o for o in args if o.startswith(("hydra.", "hydra/"))]
    args = [o for o in args if o not in hydra_args]
    if any(o in FLAGS for o in overrides):
        jobs = _jobs(args)
        print(f"sweep of {len(jobs)} job(s)" + (f" ({' '.join(hydra_args)})" if hydra_args else ""))
        for i, job in enumerate(jobs):
            cfg = _compose(job)
            why = _refusal(cfg)
            print(f"job {i}: {' '.join(job) or '(defaults)'}")
            print("  " + (f"would be refused: {why}" if why else launch_line(cfg)))
        print("nothing run (--dry-run)")
        return
    cfg = _compose(args)
    print(OmegaConf.to_yaml(cfg, resolve=True), end="")
    why = _refusal(cfg)
    if why:
        _fail(f"the run would be refused: {why}")
    print(launch_line(cfg))
    print("nothing run (--dry-run)")
