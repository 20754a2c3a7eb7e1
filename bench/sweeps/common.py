"""What the sweeps share: checked composition, the emulated cluster's profile, one sweep's
records, tables that are never replaced, the run queue."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from bench.config import hydra_value, register_configs, to_object
from bench.launch import profile
from bench.launch.run import check_results_dir, validate
from bench.launch.runqueue import run_queue
from bench.registry import ConfigError
from bench.results import whole
from bench.results.records import load_records, new_run_id

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "conf"


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def quick_methods() -> tuple[str, ...]:
    """``--quick``'s methods: the baseline and the paper's first inter-node method."""
    from bench import methods

    paper = [s.name for s in methods.specs(group="paper") if s.min_nodes > 1]
    return (*methods.names(group="baseline")[:1], *paper[:1])


def check_names(kind: str, names: Sequence[str], known: Sequence[str]) -> None:
    if not names:
        raise ConfigError(f"no {kind} given; known: {', '.join(known)}")
    for n in names:
        if n not in known:
            raise ConfigError(f"unknown {kind} {n!r}; known: {', '.join(known)}")


def split_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def new_sweep_id(kind: str) -> str:
    """``<kind>-YYYYmmdd-HHMMSS-<6 hex>``: sorts by start time, unique across machines."""
    return f"{kind}-{new_run_id()}"


def compose(overrides: Sequence[str]) -> Any:
    """The composed run config (a DictConfig) or one ConfigError line naming the problem."""
    return compose_all([overrides])[0]


def compose_all(jobs: Sequence[Sequence[str]]) -> list[Any]:
    """:func:`compose` of each override list, Hydra initialised once."""
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return [hydra_compose(config_name="config", overrides=list(o)) for o in jobs]
    except (HydraException, OmegaConfBaseException) as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        raise ConfigError(lines[0] if lines else type(e).__name__) from e


def validate_jobs(jobs: Sequence[Sequence[str]], results_dir: str) -> list[Any]:
    """The typed configs of ``jobs``, each through the run's own checks (results
    directories inspected, not made)."""
    cfgs = [to_object(c) for c in compose_all(jobs)]
    for cfg in cfgs:
        validate(cfg, create_results=False)
    check_results_dir(results_dir, create=False)
    return cfgs


def cluster_profile(cluster: str, extra: Sequence[str] = ()) -> tuple[list[str], str]:
    """Overrides that put the emulated cluster on the paper-scaled profile (unless ``extra``
    sets its own), and a line saying what the runs' links are."""
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
    """Time ``job``'s compute per step once: the override that gives every run of the sweep
    one link, and a line saying so (nothing without a profile or when pinned)."""
    cfg = to_object(compose(job))
    c = cfg.cluster
    if c.profile is None or c.profile_compute_s is not None:
        return [], ""
    p = profile.apply(cfg)
    assert p is not None
    return [f"cluster.profile_compute_s={p['compute_s']:.6g}"], "once for the sweep: " + (
        profile.describe(p)
    )


def job_base(plan: Any, topology: Sequence[str], *more: str) -> list[str]:
    """The overrides every job of ``plan`` starts with, ``topology`` on the local cluster."""
    return [
        f"experiment={plan.experiment}",
        f"cluster={plan.cluster}",
        *(topology if plan.cluster == "local" else ()),
        *plan.cluster_overrides,
        f"results.dir={hydra_value(plan.results_dir)}",
        f"results.sweep_id={plan.sweep_id}",
        "train.progress=false",
        *more,
        *plan.extra,
    ]


def sweep_records(results_dir: str | Path, sweep_id: str) -> list[dict[str, Any]]:
    """The records (latest attempt of each run) tagged with ``results.sweep_id``."""
    return [
        r
        for r in load_records(results_dir)
        if ((r.get("config") or {}).get("results") or {}).get("sweep_id") == sweep_id
    ]


def write_table(df: pd.DataFrame, path: Path) -> bool:
    """Write ``df`` as CSV, never replacing a file: False when the same table is there,
    ConfigError when another one is."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = df.to_csv(index=False)
    if path.exists():
        if path.read_text() == text:
            return False
        raise ConfigError(f"{path} exists with another table; it is not replaced")
    whole.write(path, text, replace=False)  # fails if a concurrent writer got there first
    return True


def job_label(job: Sequence[str]) -> str:
    return " ".join(o for o in job if o.split("=", 1)[0] in LABEL_KEYS)


def run_queued(jobs: Sequence[Sequence[str]], sweep_dir: str | Path, experiment: str) -> list[int]:
    """Every job through one run queue; the exit statuses.  KeyboardInterrupt when a signal
    stopped the queue: the sweep stops too, not only this stage."""
    if not jobs:
        return []
    results = run_queue(
        compose_all(jobs), experiment=experiment, output_dir=sweep_dir,
        labels=[job_label(j) for j in jobs],
    )  # fmt: skip
    if any(rc == 130 or (rec or {}).get("status") == "interrupted" for rc, rec in results):
        raise KeyboardInterrupt
    return [rc for rc, _ in results]


# the overrides that tell the jobs of a sweep apart, shown as each queued run starts
LABEL_KEYS = ("comm", "cache", "optim.update", "train.seed", "cluster.nnodes",
              "cluster.nproc_per_node", "results.protocol_role",
              "results.protocol_trial")  # fmt: skip
