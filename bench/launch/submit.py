"""A sweep's jobs submitted through a Hydra launcher (hydra-submitit-launcher), one scheduler
job per training run, grouped by allocation (docs/internals/sweeps.md)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.registry import ConfigError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
# hydra-submitit-launcher's own configs, beside conf/hydra/launcher/*.yaml
BUILTIN = ("submitit_local", "submitit_slurm")
POLL_S = 5.0


def launchers() -> list[str]:
    """The launcher configs a sweep can be submitted through."""
    ours = sorted(p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"))
    return [*ours, *(b for b in BUILTIN if b not in ours)]


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str], str]:
    """(the jobs' overrides, the ``hydra.*`` overrides, the ``hydra/launcher=`` choice or
    "")."""
    jobs, hydra, choice = [], [], ""
    for o in overrides:
        if o.startswith("hydra/launcher="):
            choice = o.split("=", 1)[1]
        elif o.startswith(("hydra.", "hydra/")):
            hydra.append(o)
        else:
            jobs.append(o)
    return jobs, hydra, choice


def check_launcher(name: str) -> None:
    """ConfigError unless ``name`` is a known launcher config and the plugin is there."""
    known = launchers()
    if name not in known:
        raise ConfigError(f"unknown launcher {name!r}; known: {', '.join(known)}")
    try:
        import hydra_plugins.hydra_submitit_launcher  # noqa: F401
        import submitit  # noqa: F401
    except ImportError as e:
        raise ConfigError(
            f"--launcher {name} needs hydra-submitit-launcher (pip install "
            f"hydra-submitit-launcher): {e}"
        ) from None


def is_slurm(launcher: str) -> bool:
    return launcher != "submitit_local"


def resources(launcher: str, cfg: Any) -> list[str]:
    """The ``hydra.launcher.*`` overrides of one job's allocation: on Slurm ``cluster.nnodes``
    nodes of ``cluster.nproc_per_node`` GPUs, one task per node; otherwise nothing."""
    if not is_slurm(launcher):
        return []
    c = cfg.cluster
    if c.name == "multinode":
        n, g = int(c.nnodes), int(c.nproc_per_node)
        return [f"hydra.launcher.nodes={n}", f"hydra.launcher.gpus_per_node={g}",
                "hydra.launcher.tasks_per_node=1"]  # fmt: skip
    return ["hydra.launcher.nodes=1", "hydra.launcher.tasks_per_node=1"]


def _hydra_config(overrides: Sequence[str]) -> tuple[Any, Any]:
    """(the Hydra object, the multirun config) of ``conf/config.yaml`` with ``overrides``."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from hydra.types import RunMode
    from omegaconf.errors import OmegaConfBaseException

    from bench.config import register_configs

    register_configs()
    GlobalHydra.instance().clear()
    try:
        initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train")
        hydra = GlobalHydra.instance().hydra
        assert hydra is not None
        cfg = hydra.compose_config(
            config_name="config",
            overrides=list(overrides),
            run_mode=RunMode.MULTIRUN,
            with_log_configuration=False,
        )
    except (HydraException, OmegaConfBaseException) as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        raise ConfigError("launcher: " + (lines[0] if lines else type(e).__name__)) from e
    return hydra, cfg


def make_launcher(hydra_overrides: Sequence[str], task: Callable[..., Any]) -> Any:
    """Hydra's launcher plugin for ``hydra_overrides`` (``hydra/launcher=...`` first),
    set up as a multirun would set it up (a bad launcher key: one ConfigError line)."""
    from hydra._internal.callbacks import Callbacks
    from hydra.core.plugins import Plugins
    from hydra.core.utils import setup_globals
    from hydra.types import HydraContext

    setup_globals()
    hydra, cfg = _hydra_config(hydra_overrides)
    ctx = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks(cfg))
    try:
        return Plugins.instance().instantiate_launcher(
            hydra_context=ctx, task_function=task, config=cfg
        )
    except Exception as e:  # noqa: BLE001  (Hydra wraps a bad launcher key in several types)
        raise ConfigError(f"launcher: {str(e).splitlines()[0]}") from e


def _executor(launcher: Any) -> Any:
    """The submitit executor of ``launcher``, made as its ``launch`` makes it."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    kind, params = launcher._EXECUTOR, dict(launcher.params)
    init = {"folder": params.pop("submitit_folder")}
    if "max_num_timeout" in params:
        init[f"{kind}_max_num_timeout"] = params.pop("max_num_timeout")
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    ex = submitit.AutoExecutor(cluster=kind, **init)
    ex.update_parameters(**{k if k in base else f"{kind}_{k}": v for k, v in params.items()})
    return ex


def plan_groups(launcher: str, cfgs: Sequence[Any]) -> dict[tuple[str, ...], list[int]]:
    """Job indices grouped by allocation (:func:`resources`), in order of first use."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, cfg in enumerate(cfgs):
        groups.setdefault(tuple(resources(launcher, cfg)), []).append(i)
    return groups


def check_groups(launcher: str, hydra_overrides: Sequence[str], cfgs: Sequence[Any]) -> None:
    """Compose the launcher's config of every allocation ``cfgs`` need, resolved: a bad
    launcher key or value is one ConfigError, before anything is submitted."""
    from omegaconf import OmegaConf

    check_launcher(launcher)
    for alloc in plan_groups(launcher, cfgs):
        _, cfg = _hydra_config([f"hydra/launcher={launcher}", *hydra_overrides, *alloc])
        try:
            OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
        except Exception as e:  # noqa: BLE001  (an interpolation that does not resolve)
            raise ConfigError(f"launcher: {str(e).splitlines()[0]}") from e


def submit(
    jobs: Sequence[Sequence[str]],
    cfgs: Sequence[Any],
    *,
    launcher: str,
    hydra_overrides: Sequence[str],
    sweep_dir: str | Path,
    task: Callable[..., Any],
    labels: Sequence[str] | None = None,
    log: Callable[[str], None] = print,
) -> list[int]:
    """Submit every job (complete Hydra overrides; ``cfgs`` their composed configs) through
    ``launcher`` and wait for all of them; exit status per job (0: the job ended, its run
    recorded by itself; 1: the job failed, killed or lost)."""
    from hydra.core.singleton import Singleton

    check_launcher(launcher)
    sweep_dir = Path(sweep_dir) / time.strftime("%Y%m%d-%H%M%S")
    names = list(labels) if labels else [" ".join(j) for j in jobs]
    base = [f"hydra/launcher={launcher}", *hydra_overrides, f"hydra.sweep.dir={sweep_dir}",
            "hydra.sweep.subdir=${hydra.job.num}"]  # fmt: skip
    made = []
    for alloc, idx in plan_groups(launcher, cfgs).items():
        lau = make_launcher([*base, *alloc], task)
        ex = _executor(lau)
        args = [(list(jobs[i]), "hydra.sweep.dir", i, f"job_id_for_{i}", Singleton.get_state())
                for i in idx]  # fmt: skip
        subs = ex.map_array(lau, *zip(*args))
        what = " ".join(alloc) or "this machine"
        log(f"submitted {len(subs)} job(s) through {launcher} ({what}): "
            + " ".join(str(s.job_id) for s in subs))  # fmt: skip
        made += list(zip(idx, subs))
    log(f"jobs' Hydra output: {sweep_dir}")
    return _wait(made, names, len(jobs), log)


def _wait(
    made: list[tuple[int, Any]], names: list[str], n: int, log: Callable[[str], None]
) -> list[int]:
    import submitit

    rcs = [1] * n
    by_job = {id(s): i for i, s in made}
    done = 0
    for s in submitit.helpers.as_completed([s for _, s in made], poll_frequency=POLL_S):
        i, done = by_job[id(s)], done + 1
        err = s.exception()
        rcs[i] = 0 if err is None else 1
        why = "" if err is None else ": " + (str(err).strip().splitlines() or ["failed"])[-1][:200]
        log(f"[{done}/{len(made)}] job {s.job_id} {'ended' if err is None else 'failed'}"
            f" ({names[i]}){why}")  # fmt: skip
    return rcs
