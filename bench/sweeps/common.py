"""What the sweeps share: the known config options, a checked composition, sweep ids,
the emulated cluster's profile, the records of one sweep and tables that never replace
what is already written."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from bench.config import register_configs, to_object
from bench.launch import profile
from bench.launch.run import check_results_dir, validate
from bench.launch.runqueue import run_queue
from bench.registry import ConfigError
from bench.results.records import load_records, new_run_id

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "conf"


def options(group: str) -> list[str]:
    """The choices of a config group: the stems of ``conf/<group>/*.yaml``."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_names(kind: str, names: Sequence[str], known: Sequence[str]) -> None:
    """ConfigError naming the first of ``names`` not in ``known``, and the known ones."""
    if not names:
        raise ConfigError(f"no {kind} given; known: {', '.join(known)}")
    for n in names:
        if n not in known:
            raise ConfigError(f"unknown {kind} {n!r}; known: {', '.join(known)}")


def split_list(text: str) -> list[str]:
    """``"a,b, c"`` -> ``["a", "b", "c"]`` (empty items dropped)."""
    return [t.strip() for t in text.split(",") if t.strip()]


def new_sweep_id(kind: str) -> str:
    """``<kind>-YYYYmmdd-HHMMSS-<6 hex>``: sorts by start time, unique across machines."""

    return f"{kind}-{new_run_id()}"


def compose(overrides: Sequence[str]) -> Any:
    """The composed run config (a DictConfig) or one ConfigError line naming the problem."""
    return compose_all([overrides])[0]


def compose_all(jobs: Sequence[Sequence[str]]) -> list[Any]:
    """:func:`compose` of each override list, Hydra initialised once for all of them."""

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return [hydra_compose(config_name="config", overrides=list(o)) for o in jobs]
    except (HydraException, OmegaConfBaseException) as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        raise ConfigError(lines[0] if lines else type(e).__name__) from e


def validate_jobs(jobs: Sequence[Sequence[str]], results_dir: str) -> list[Any]:
    """Compose each job and run the run's own checks (``bench.launch.run.validate``) on it,
    the results directories inspected, not made (a results directory that is a file is
    refused here, as the run would).  Returns the typed configs."""

    cfgs = [to_object(c) for c in compose_all(jobs)]
    for cfg in cfgs:
        validate(cfg, create_results=False)
    check_results_dir(results_dir, create=False)
    return cfgs


def cluster_profile(cluster: str, extra: Sequence[str] = ()) -> tuple[list[str], str]:
    """Overrides that put ``cluster`` on the paper-scaled link profile, and a line saying
    what the runs' links are.  Only the emulated cluster has links to shape; it takes
    ``cluster.profile=paper`` when its config has a ``profile`` key, else the configured
    bandwidth.  The sweep's own ``cluster.*`` overrides (``extra``) win: a bandwidth or a
    profile given there is what the note reports, and no profile is added."""
    if cluster != "emulated":
        return [], f"cluster {cluster}: the machine's own links, nothing shaped"
    mine = [o for o in extra if o.startswith("cluster.")]
    node = compose([f"cluster={cluster}", *mine]).cluster
    given = {o.split("=", 1)[0] for o in mine}
    if "profile" in node and not given & {"cluster.profile", "cluster.inter_node_bandwidth"}:
        return ["cluster.profile=paper"], "cluster emulated: paper-scaled profile (profile=paper)"
    bw = node.get("inter_node_bandwidth", "?")
    if given & {"cluster.profile", "cluster.inter_node_bandwidth"}:
        prof = node.get("profile")
        return [], f"cluster emulated: as overridden, inter_node_bandwidth={bw}, profile={prof}"
    return [], (
        f"cluster emulated: its config has no 'profile' key, so the links run at the "
        f"configured inter_node_bandwidth={bw}"
    )


def pin_profile(job: Sequence[str]) -> tuple[list[str], str]:
    """Time the compute per step of ``job`` (a profiled emulated run's overrides) once,
    here, and return ``cluster.profile_compute_s=...`` for every job of the sweep, so that
    all of its runs share one link instead of each timing (and choosing) its own; with a
    line saying what was measured.  No profile, or one already pinned: nothing."""

    cfg = to_object(compose(job))
    c = cfg.cluster
    if c.profile is None or c.profile_compute_s is not None:
        return [], ""
    p = profile.apply(cfg)
    assert p is not None
    return [f"cluster.profile_compute_s={p['compute_s']:.6g}"], "once for the sweep: " + (
        profile.describe(p)
    )


def pin_link(job: Sequence[str]) -> tuple[list[str], str]:
    """The paper-scaled bandwidth for ``job`` (the sweep's largest topology), as one
    ``cluster.inter_node_bandwidth=...`` for every run of a sweep whose topologies differ
    (the scaling study compares them over one link); with a line saying how it was chosen.
    No profile in ``job``: nothing."""

    cfg = to_object(compose(job))
    p = profile.apply(cfg)
    if p is None:
        return [], ""
    topo = f"{cfg.cluster.nnodes}x{cfg.cluster.nproc_per_node}"
    return [
        "cluster.profile=null",
        f"cluster.inter_node_bandwidth={p['inter_node_bandwidth']}",
    ], f"one link for every topology, chosen on {topo}: {profile.describe(p)}"


def sweep_records(results_dir: str | Path, sweep_id: str) -> list[dict[str, Any]]:
    """The records (latest attempt of each run) tagged with ``results.sweep_id``."""

    return [
        r
        for r in load_records(results_dir)
        if ((r.get("config") or {}).get("results") or {}).get("sweep_id") == sweep_id
    ]


def write_table(df: pd.DataFrame, path: Path) -> bool:
    """Write ``df`` as CSV at ``path``; an existing file is never replaced.  Returns False
    when the same table is already there; raises ConfigError when another one is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = df.to_csv(index=False)
    if path.exists():
        if path.read_text() == text:
            return False
        raise ConfigError(f"{path} exists with another table; it is not replaced")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    try:
        os.link(tmp, path)  # fails if a concurrent writer got there first
    finally:
        tmp.unlink(missing_ok=True)
    return True


def run_train(args: Sequence[str]) -> int:
    """``python -m reproduce train ARGS`` in a subprocess, its output passed through (in
    this process's working directory, so that relative result paths mean the same)."""
    cmd = [sys.executable, "-m", "reproduce", "train", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(cmd, env=env, check=False).returncode


def job_label(job: Sequence[str]) -> str:
    """The overrides that tell the jobs of a sweep apart (:data:`LABEL_KEYS`)."""
    return " ".join(o for o in job if o.split("=", 1)[0] in LABEL_KEYS)


def run_queued(jobs: Sequence[Sequence[str]], sweep_dir: str | Path, experiment: str) -> list[int]:
    """Every job (Hydra overrides, as for ``python -m reproduce train``) through a run queue
    (:mod:`bench.launch.runqueue`): the workers are launched once for each stretch of consecutive
    jobs on the same cluster config, and each job is still its own run with its own
    record.  Run JSONs go to ``sweep_dir``.  Returns the exit statuses."""

    if not jobs:
        return []
    results = run_queue(
        compose_all(jobs), experiment=experiment, output_dir=sweep_dir,
        labels=[job_label(j) for j in jobs],
    )  # fmt: skip
    return [rc for rc, _ in results]


# the overrides that tell the jobs of a sweep apart, shown as each queued run starts
LABEL_KEYS = ("comm", "cache", "optim.update", "train.seed", "cluster.nnodes",
              "cluster.nproc_per_node", "results.protocol_role",
              "results.protocol_trial")  # fmt: skip
