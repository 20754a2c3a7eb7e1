"""A sweep's jobs submitted through a Hydra launcher (hydra-submitit-launcher), one scheduler
job per training run, grouped by allocation (docs/internals/sweeps.md)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.registry import ConfigError

try:  # the plugin is optional: check_launcher says how to install it
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import (
        SlurmLauncher as _SubmititSlurm,
    )
except ImportError:  # pragma: no cover
    _SubmititSlurm = object

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


GRES_GPU = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


@dataclass(frozen=True)
class Partition:
    """What the nodes of a Slurm partition offer (``sinfo``): its name, node count and the
    largest node's CPUs, memory (MiB) and GPUs (GRES)."""

    name: str
    nodes: int
    cpus: int
    mem_mb: int
    gpus: int
    gres: str


def parse_sinfo(text: str, partition: str | None) -> Partition | None:
    """``sinfo --noheader --Node --format=%N|%P|%c|%m|%G`` of ``partition`` (None: the
    default one, marked ``*``); None when the output names no such partition."""
    rows = [ln.split("|") for ln in text.splitlines() if ln.count("|") == 4]
    if partition is None:
        partition = next((r[1].rstrip("*") for r in rows if r[1].endswith("*")), None)
    rows = [r for r in rows if r[1].rstrip("*") == partition]
    if not rows:
        return None

    def gpus(gres: str) -> int:
        return sum(int(g) for g in GRES_GPU.findall(gres))

    def num(x: str) -> int:
        return int(re.sub(r"\D.*", "", x) or 0)

    return Partition(
        name=str(partition),
        nodes=len({r[0] for r in rows}),
        cpus=max(num(r[2]) for r in rows),
        mem_mb=max(num(r[3]) for r in rows),
        gpus=max(gpus(r[4]) for r in rows),
        gres=",".join(sorted({r[4] for r in rows})),
    )


def partition_info(partition: str | None) -> Partition | None:
    """The partition's nodes as ``sinfo`` reports them; None where there is no ``sinfo``
    (submitit's local executor, a machine outside the cluster)."""
    if shutil.which("sinfo") is None:
        return None
    cmd = ["sinfo", "--noheader", "--Node", "--format=%N|%P|%c|%m|%G"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    info = parse_sinfo(p.stdout, partition)
    if info is None and partition is not None and p.stdout.strip():
        known = sorted({ln.split("|")[1].rstrip("*") for ln in p.stdout.splitlines() if "|" in ln})
        raise ConfigError(
            f"launcher: hydra.launcher.partition={partition} is not a partition of this "
            f"cluster; known: {', '.join(known)}"
        )
    return info


def given_keys(hydra_overrides: Sequence[str]) -> set[str]:
    """The ``hydra.launcher.*`` keys the user set (they are never replaced)."""
    return {o.split("=", 1)[0].removeprefix("hydra.launcher.").lstrip("+")
            for o in hydra_overrides if o.lstrip("+").startswith("hydra.launcher.")}  # fmt: skip


def partition_of(hydra_overrides: Sequence[str]) -> str | None:
    for o in hydra_overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key == "hydra.launcher.partition" and value not in ("", "null"):
            return value
    return None


def resources(
    launcher: str, cfg: Any, partition: Partition | None = None, given: Sequence[str] = ()
) -> list[str]:
    """The ``hydra.launcher.*`` overrides of one job's allocation: on Slurm the nodes of
    its topology, one task per node with a CPU per worker (times
    ``cluster.threads_per_worker``), and a GPU per worker only where it trains on GPUs
    (``train.device=cuda``, or ``auto`` on a partition with GPUs; unknown partition:
    GPUs); keys in ``given`` are the user's and left alone; otherwise nothing."""
    if not is_slurm(launcher):
        return []
    c = cfg.cluster
    multi = c.name == "multinode"
    n = int(c.nnodes) if multi else 1
    workers = int(c.nproc_per_node) * (1 if multi else int(c.nnodes))
    device = str(cfg.train.device)
    gpus = device == "cuda" or (device == "auto" and (partition is None or partition.gpus > 0))
    out = {"nodes": n, "tasks_per_node": 1,
           "cpus_per_task": workers * max(1, int(c.threads_per_worker or 1))}  # fmt: skip
    if gpus:
        out["gpus_per_node"] = workers
    return [f"hydra.launcher.{k}={v}" for k, v in out.items() if k not in set(given)]


def check_fit(params: Any, partition: Partition | None) -> None:
    """ConfigError naming the first ``hydra.launcher`` value that no node of the partition
    can satisfy (``params``: the launcher's resolved config)."""
    if partition is None:
        return
    p = partition
    tasks = int(params.get("tasks_per_node") or 1)
    checks = [
        ("nodes", params.get("nodes"), p.nodes, f"the partition has {p.nodes} node(s)"),
        ("gpus_per_node", params.get("gpus_per_node"), p.gpus,
         f"its nodes have at most {p.gpus} GPU(s) (GRES {p.gres})"),
        ("cpus_per_task", params.get("cpus_per_task"), p.cpus // tasks,
         f"its nodes have at most {p.cpus} CPUs for {tasks} task(s)"),
        ("mem_gb", params.get("mem_gb"), p.mem_mb / 1024,
         f"its nodes have at most {p.mem_mb / 1024:.1f} GB"),
    ]  # fmt: skip
    for key, want, have, why in checks:
        if want is not None and float(want) > have:
            raise ConfigError(
                f"launcher: hydra.launcher.{key}={want} cannot be satisfied on partition "
                f"{p.name}: {why}"
            )


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


def plan_groups(
    launcher: str, cfgs: Sequence[Any], hydra_overrides: Sequence[str] = ()
) -> dict[tuple[str, ...], list[int]]:
    """Job indices grouped by allocation (:func:`resources`), in order of first use."""
    part = partition_info(partition_of(hydra_overrides)) if is_slurm(launcher) else None
    given = given_keys(hydra_overrides)
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, cfg in enumerate(cfgs):
        groups.setdefault(tuple(resources(launcher, cfg, part, given)), []).append(i)
    return groups


def check_groups(launcher: str, hydra_overrides: Sequence[str], cfgs: Sequence[Any]) -> None:
    """Compose the launcher's config of every allocation ``cfgs`` need, resolved: a bad
    launcher key or value, or a request no node of the partition can satisfy, is one
    ConfigError, before anything is submitted."""
    from omegaconf import OmegaConf

    check_launcher(launcher)
    part = partition_info(partition_of(hydra_overrides)) if is_slurm(launcher) else None
    for alloc in plan_groups(launcher, cfgs, hydra_overrides):
        _, cfg = _hydra_config([f"hydra/launcher={launcher}", *hydra_overrides, *alloc])
        try:
            params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
        except Exception as e:  # noqa: BLE001  (an interpolation that does not resolve)
            raise ConfigError(f"launcher: {str(e).splitlines()[0]}") from e
        check_fit(params, part)


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
    for alloc, idx in plan_groups(launcher, cfgs, hydra_overrides).items():
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
    rcs = [1] * len(jobs)
    for i, why in zip([i for i, _ in made], wait_jobs([s for _, s in made], names, log)):
        rcs[i] = 0 if why is None else 1
    return rcs


# Slurm's states of a job that will not run again (a requeued or preempted job will)
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE")  # fmt: skip


def slurm_end(job_id: str) -> str | None:
    """How job ``job_id`` ended, as the controller says (``scontrol show job``: state,
    reason, exit code), or None while it is pending, running or requeued.  Works without
    accounting, where submitit's ``sacct`` never sees a job end."""
    try:
        p = subprocess.run(["scontrol", "show", "job", "--oneliner", str(job_id)],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        # purged from the controller's memory: ended long ago, with no word left
        return "gone from the controller" if "Invalid job id" in p.stderr else None
    fields = dict(re.findall(r"(\w+)=(\S*)", p.stdout))
    state = fields.get("JobState", "")
    if state not in ENDED:
        return None
    code = fields.get("ExitCode", "?").split(":")
    how = f"exit code {code[0]}" + (
        f", signal {code[1]}" if len(code) > 1 and code[1] != "0" else ""
    )
    reason = fields.get("Reason", "None")
    return f"{state}, {how}" + ("" if reason in ("None", "") else f", reason {reason}")


def log_tail(job: Any, n: int = 5) -> str:
    """The last ``n`` non-empty lines of the job's stderr (else stdout), joined by `` | ``."""
    for path in (job.paths.stderr, job.paths.stdout):
        try:
            lines = [ln for ln in Path(path).read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            continue
        if lines:
            return " | ".join(ln.strip()[:300] for ln in lines[-n:])
    return "no log"


def _outcome(job: Any, slurm: bool) -> tuple[bool, str | None]:
    """(whether ``job`` has ended, None if it left a result else why not)."""
    if job.paths.result_pickle.exists() or (not slurm and job.done()):
        try:
            err = job.exception()
        except Exception as e:  # noqa: BLE001  (submitit: no result, e.g. killed)
            err = e
        if err is None:
            return True, None
        return True, (str(err).strip().splitlines() or ["failed"])[-1][:200]
    if not slurm:
        return False, None
    end = slurm_end(job.job_id)
    if end is None:
        return False, None
    time.sleep(1.0)  # the result is written before the job's end: one last look
    if job.paths.result_pickle.exists():
        return _outcome(job, slurm)
    return True, f"ended without a result ({end}); log: {log_tail(job)}"


def wait_jobs(jobs: Sequence[Any], names: Sequence[str], log: Callable[[str], None]) -> list:
    """Wait for every submitit job, polling each ``POLL_S``; per job None when it ended
    with a result, else why it failed.  On Slurm a job that ends without a result (exit
    before the result, killed, a node lost) is seen through the controller
    (:func:`slurm_end`) within a poll, and reported with its exit code and log's tail."""
    import submitit

    out: list = [None] * len(jobs)
    left = list(range(len(jobs)))
    while left:
        for i in list(left):
            s = jobs[i]
            ended, why = _outcome(s, isinstance(s, submitit.SlurmJob))
            if not ended:
                continue
            left.remove(i)
            out[i] = why
            log(f"[{len(jobs) - len(left)}/{len(jobs)}] job {s.job_id} "
                f"{'ended' if why is None else 'failed'} ({names[i]})"
                + ("" if why is None else f": {why}"))  # fmt: skip
        if left:
            time.sleep(POLL_S)
    return out


class SlurmLauncher(_SubmititSlurm):  # type: ignore[misc,valid-type]
    """hydra-submitit-launcher's Slurm launcher (``hydra/launcher=slurm``) that refuses a
    request no node of the partition can satisfy before submitting, and sees a job end
    without accounting (:func:`wait_jobs`): ``train -m`` never waits forever."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from hydra.core.singleton import Singleton
        from hydra.core.utils import JobReturn, JobStatus, filter_overrides

        try:
            check_fit(self.params, partition_info(self.params.get("partition")))
        except ConfigError as e:  # one line, before anything is submitted
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        ex = _executor(self)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        idx = [initial_job_idx + i for i in range(len(job_overrides))]
        args = [(list(o), "hydra.sweep.dir", i, f"job_id_for_{i}", Singleton.get_state())
                for i, o in zip(idx, job_overrides)]  # fmt: skip
        jobs = ex.map_array(self, *zip(*args))
        names = [" ".join(filter_overrides(o)) for o in job_overrides]
        print(f"submitted {len(jobs)} job(s) to Slurm: "
              + " ".join(str(j.job_id) for j in jobs), flush=True)  # fmt: skip
        whys = wait_jobs(jobs, names, lambda m: print(m, flush=True))
        return [
            j.results()[0] if why is None
            else JobReturn(overrides=list(o), status=JobStatus.FAILED,
                           _return_value=RuntimeError(f"job {j.job_id}: {why}"))
            for j, o, why in zip(jobs, job_overrides, whys)
        ]  # fmt: skip
