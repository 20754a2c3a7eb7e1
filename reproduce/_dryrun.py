"""``train --dry-run`` / ``dawnbench --dry-run``: the config composed and checked as for a
real run, then a short plan (what, where, how long); nothing is launched."""

from __future__ import annotations

import functools
import os
import statistics
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reproduce._cli import REFERENCE, did_you_mean, fail, unquoted

FLAGS = ("-m", "--multirun")
VERBOSE = ("-v", "--verbose")


def _suggest_key(full_key: str) -> str:
    """``"; did you mean optim.lr?"``: the closest key at the same level of the defaults."""
    from omegaconf import DictConfig

    parent, _, leaf = full_key.rpartition(".")
    try:
        node = _default_config()
        for part in parent.split(".") if parent else []:
            node = node[part]
    except Exception:  # noqa: BLE001  (no such parent: nothing to suggest at its level)
        return ""
    if not isinstance(node, DictConfig):
        return ""
    hint = did_you_mean(leaf, [str(k) for k in node.keys()])
    return hint.replace("mean ", f"mean {parent}.") if parent and hint else hint


def hydra_error(e: BaseException) -> str:
    """One line from a Hydra/OmegaConf error, with "did you mean" where it helps."""
    import re

    text = str(e)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    msg = lines[0] if lines else type(e).__name__
    cause = e.__cause__
    ctext = str(cause) if cause is not None else ""
    missing_key = re.search(r"Key '([^']+)' not in", ctext)
    full_key = re.search(r"full_key: (\S+)", ctext)
    if msg.startswith("Could not override") and missing_key and full_key:
        # Hydra's "To append to your config use +key=..." would add a key nothing reads
        key = full_key.group(1)
        return f"unknown config key {key!r}{_suggest_key(key)}"
    hint = ""
    if "Available options in" in text:
        opts = [ln.strip() for ln in lines if ln.startswith("\t") and "provider=" not in ln]
        m = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
        if m:
            msg, hint = f"unknown {m.group(1)}={m.group(2)}", did_you_mean(m.group(2), opts)
        if opts:
            msg += f"; known: {', '.join(opts)}"
    if ctext:
        c = [ln for ln in ctext.splitlines() if ln.strip()]
        msg += f" ({c[0]})" if c else ""
    return msg + hint


def _compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from reproduce.train import CONF_DIR

    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            return hydra_compose(config_name="config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as e:
        fail(hydra_error(e))


_default_config = functools.lru_cache(maxsize=1)(lambda: _compose([]))


def compose(overrides: list[str]) -> Any:
    """The run's config, or one error line and exit 2.  A ``+key=`` that adds a key nothing
    reads (not a config group) is refused like a misspelt ``key=``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from reproduce.train import CONF_DIR

    cfg, added = _compose(overrides), {}
    for o in (o for o in overrides if o.startswith("+")):
        try:
            parsed = OverridesParser.create().parse_override(o)
        except Exception:  # noqa: BLE001  (Hydra reports a malformed override itself)
            continue
        key = parsed.key_or_group
        if parsed.package is None and not (Path(CONF_DIR) / key.replace(".", "/")).is_dir():
            added[o] = key
    if added:
        base, missing = _compose([o for o in overrides if o not in added]), object()
        for key in added.values():
            if OmegaConf.select(base, key, default=missing) is missing:
                fail(f"unknown config key {key!r}{_suggest_key(key)}")
    return cfg


def refusal(cfg: Any) -> str | None:
    """Why the run would be refused before its workers start, or None."""
    from bench.config import to_object
    from bench.data.cache import inspect_only
    from bench.launch.run import validate
    from bench.registry import ConfigError

    try:
        with inspect_only():  # the data files the run would make are not made here
            validate(to_object(cfg), create_results=False)
    except ConfigError as e:
        return str(e)
    return None


def launch_line(cfg: Any) -> str:
    """World size, nodes, launcher and where the record would go."""
    c = cfg.cluster
    world = int(c.nnodes) * int(c.nproc_per_node)
    runs = Path(str(cfg.results.dir)) / "runs.jsonl"
    return (
        f"would launch: {world} worker(s) = {c.nnodes} node(s) x {c.nproc_per_node} "
        f"(cluster={c.name}), {cfg.model.name} on {cfg.data.name}, comm={cfg.comm.name}, "
        f"update={cfg.optim['update']}, to {cfg.train.target_metric} >= {cfg.train.target_value} "
        f"in <= {cfg.train.epochs} epochs (experiment {cfg.experiment}); record appended to {runs}"
    )


def duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


def earlier_runs(results_dir: Any, keep: Callable[[dict], bool]) -> tuple[list[dict], str]:
    """The finished runs ``keep`` accepts in ``results_dir`` and the reference results (on
    this machine's hardware where some are), and a phrase saying which."""
    from bench.results.env import REPO_ROOT, hardware
    from bench.results.records import load_records

    found = []
    for d in dict.fromkeys([Path(str(results_dir)), REPO_ROOT / REFERENCE]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn line elsewhere does not matter here
            recs = load_records(d) if (d / "runs.jsonl").is_file() else []
        ok = ("ok", "target_missed")
        found += [r for r in recs if r.get("status") in ok and r.get("wall_time_s") and keep(r)]
    here = [r for r in found if r.get("hardware") == hardware()]
    on = "this machine's hardware" if here or not found else found[0].get("hardware")
    return here or found, f"on {on}"


def startup_s() -> float:
    """Seconds since this process started (Linux; else 0): what a wall time leaves out."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def estimate(cfg: Any) -> str:
    """The median wall time of earlier runs like this one, plus this command's start-up."""
    c = cfg.cluster
    key = (
        str(cfg.experiment),
        str(cfg.comm.name),
        int(c.nnodes) * int(c.nproc_per_node),
        int(cfg.train.epochs),
    )

    def same(r: dict) -> bool:
        epochs = ((r.get("config") or {}).get("train") or {}).get("epochs")
        return (r.get("experiment"), r.get("comm"), r.get("world_size"), epochs) == key

    pick, on = earlier_runs(cfg.results.dir, same)
    if not pick:
        return (
            f"expected time: unknown (no earlier run of {key[0]} with comm={key[1]} on "
            f"{key[2]} worker(s) here or in {REFERENCE}/); at most {key[3]} epoch(s)"
        )
    t, up = statistics.median(float(r["wall_time_s"]) for r in pick), startup_s()
    return (
        f"expected time: about {duration(t + up)} ({duration(t)}: the median wall time of "
        f"{len(pick)} earlier run(s) of this configuration, {on}; {up:.0f} s: this "
        "command's start-up, measured now)"
    )


def sweep_jobs(overrides: list[str]) -> list[list[str]]:
    """The overrides of each job of a ``-m`` sweep, in Hydra's order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        fail(hydra_error(e))
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def _resume(overrides: list[str]) -> None:
    """``resume=RUN_ID --dry-run``: the checks the resume makes, then its plan."""
    from bench.data.cache import inspect_only
    from bench.launch.run import prepare_resume
    from bench.registry import ConfigError

    run_id = next(o.split("=", 1)[1] for o in overrides if o.startswith("resume="))
    # as the real resume: the checkpoint has the recipe (dawnbench adds experiment=)
    rest = [o for o in overrides if not o.startswith(("resume=", "experiment=", "data=", "-"))]
    rest = unquoted(rest)
    try:
        with inspect_only():
            cfg, meta, path = prepare_resume(run_id, rest, dry=True)
    except ConfigError as e:
        fail(f"the resume would be refused: {e}")
    runs = Path(str(cfg.results.dir)) / "runs.jsonl"
    print(
        f"would resume run {run_id} from its checkpoint {path} (attempt {meta['attempt']}, "
        f"to at most {cfg.train.epochs} epochs); record appended to {runs}"
    )
    print("nothing run (--dry-run)")


def dry_run(overrides: list[str]) -> None:
    """Check and plan what ``train <overrides>`` would run, and run nothing."""
    from omegaconf import OmegaConf

    if any(o.startswith("resume=") for o in overrides):
        _resume(overrides)
        return
    verbose = any(o in VERBOSE for o in overrides)
    ignored = [o for o in overrides if o.startswith("-") and o not in (*FLAGS, *VERBOSE)]
    if ignored:
        print(f"(ignored with --dry-run: {' '.join(ignored)})")
    args = [o for o in overrides if not o.startswith("-")]
    hydra_args = [o for o in args if o.startswith(("hydra.", "hydra/"))]
    args = [o for o in args if o not in hydra_args]
    if any(o in FLAGS for o in overrides):
        jobs = sweep_jobs(args)
        print(f"sweep of {len(jobs)} job(s)" + (f" ({' '.join(hydra_args)})" if hydra_args else ""))
        for i, job in enumerate(jobs):
            cfg = compose(job)
            why = refusal(cfg)
            print(f"job {i}: {' '.join(job) or '(defaults)'}")
            print("  " + (f"would be refused: {why}" if why else launch_line(cfg)))
            if not why:
                print("  " + estimate(cfg))
        print("nothing run (--dry-run)")
        return
    cfg = compose(args)
    why = refusal(cfg)
    if why:
        fail(f"the run would be refused: {why}")
    print(launch_line(cfg))
    print(estimate(cfg))
    from bench.train.progress import BUSY_PER_CORE

    try:
        load, cores = os.getloadavg()[0], len(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        load, cores = 0.0, 1
    if load / cores > BUSY_PER_CORE:
        print(
            f"note: this machine is busy now (load average {load:.1f} on {cores} cores): runs "
            "will take longer than the estimate, and their timings are unreliable"
        )
    print("checks passed: the config, the data, the cluster's requirements, the results directory")
    if verbose:
        print("resolved config:\n" + OmegaConf.to_yaml(cfg, resolve=True), end="")
    else:
        print("(--verbose prints the resolved config)")
    print("nothing run (--dry-run)")
