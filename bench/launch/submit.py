"""A sweep's jobs submitted through a Hydra launcher (hydra-submitit-launcher), one scheduler
job per training run, grouped by allocation (docs/internals/sweeps.md)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
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
BUILTIN = ("submitit_local", "submitit_slurm")  # the plugin's own, beside conf/hydra/launcher
POLL_S = 5.0
GRES_GPU = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")
FAILED = ("interrupted", "error")  # a record's statuses of a run that did not end


def launchers() -> list[str]:
    """The launcher configs a sweep can be submitted through."""
    ours = sorted(p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"))
    return [*ours, *(b for b in BUILTIN if b not in ours)]


def split_overrides(overrides: Sequence[str]) -> tuple[list[str], list[str], str]:
    """(the jobs' overrides, the ``hydra.*`` ones, the ``hydra/launcher=`` choice or "")."""
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


@dataclass(frozen=True)
class Partition:
    """A Slurm partition (``sinfo``): its nodes, and its largest node's CPUs, MiB and GPUs."""

    name: str
    nodes: int
    cpus: int
    mem_mb: int
    gpus: int
    gres: str


def parse_sinfo(text: str, partition: str | None) -> Partition | None:
    """``sinfo --noheader --Node --format=%N|%P|%c|%m|%G`` of ``partition`` (None: the
    default one); None when the output names no such partition."""
    rows = [ln.split("|") for ln in text.splitlines() if ln.count("|") == 4]
    if partition is None:
        partition = next((r[1].rstrip("*") for r in rows if r[1].endswith("*")), None)
    rows = [r for r in rows if r[1].rstrip("*") == partition]
    if not rows:
        return None

    def num(x: str) -> int:
        return int(re.sub(r"\D.*", "", x) or 0)

    return Partition(
        name=str(partition),
        nodes=len({r[0] for r in rows}),
        cpus=max(num(r[2]) for r in rows),
        mem_mb=max(num(r[3]) for r in rows),
        gpus=max(sum(int(g) for g in GRES_GPU.findall(r[4])) for r in rows),
        gres=",".join(sorted({r[4] for r in rows})),
    )


def partition_info(partition: str | None) -> Partition | None:
    """The partition as ``sinfo`` reports it; None where there is no ``sinfo``."""
    cmd = ["sinfo", "--noheader", "--Node", "--format=%N|%P|%c|%m|%G"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):  # no sinfo
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


def _launcher_keys(hydra_overrides: Sequence[str]) -> dict[str, str]:
    pairs = (o.lstrip("+").partition("=") for o in hydra_overrides)
    return {
        k.removeprefix("hydra.launcher."): v for k, _, v in pairs if k.startswith("hydra.launcher.")
    }


def _partition(launcher: str, hydra_overrides: Sequence[str]) -> Partition | None:
    name = _launcher_keys(hydra_overrides).get("partition") or None
    return partition_info(None if name == "null" else name) if is_slurm(launcher) else None


def resources(
    launcher: str, cfg: Any, partition: Partition | None = None, given: Sequence[str] = ()
) -> list[str]:
    """One job's Slurm allocation as ``hydra.launcher.*`` overrides (``given`` left alone): a
    GPU per worker where it trains on GPUs (``cuda``, or ``auto`` on a partition with some)."""
    if not is_slurm(launcher):
        return []
    c = cfg.cluster
    multi = c.name == "multinode"
    workers = int(c.nproc_per_node) * (1 if multi else int(c.nnodes))
    device = str(cfg.train.device)
    gpus = device == "cuda" or (device == "auto" and (partition is None or partition.gpus > 0))
    out = {"nodes": int(c.nnodes) if multi else 1, "tasks_per_node": 1,
           "cpus_per_task": workers * max(1, int(c.threads_per_worker or 1))}  # fmt: skip
    if gpus:
        out["gpus_per_node"] = workers
    return [f"hydra.launcher.{k}={v}" for k, v in out.items() if k not in set(given)]


def check_fit(params: Any, partition: Partition | None) -> None:
    """ConfigError naming the first ``hydra.launcher`` value no node of the partition fits."""
    if partition is None:
        return
    p = partition
    tasks = int(params.get("tasks_per_node") or 1)
    cpus = f"its nodes have at most {p.cpus} CPUs for {tasks} task(s)"
    checks = [
        ("nodes", p.nodes, f"the partition has {p.nodes} node(s)"),
        ("gpus_per_node", p.gpus, f"its nodes have at most {p.gpus} GPU(s) (GRES {p.gres})"),
        ("cpus_per_task", p.cpus // tasks, cpus),
        ("mem_gb", p.mem_mb / 1024, f"its nodes have at most {p.mem_mb / 1024:.1f} GB"),
    ]
    for key, have, why in checks:
        want = params.get(key)
        if want is not None and float(want) > have:
            raise ConfigError(
                f"launcher: hydra.launcher.{key}={want} cannot be satisfied on partition "
                f"{p.name}: {why}"
            )


def _hydra_config(overrides: Sequence[str]) -> tuple[Any, Any]:
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
    """Hydra's launcher plugin, set up as a multirun sets it up."""
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


def _map_array(launcher: Any, overrides: Sequence[Sequence[str]], idx: Sequence[int]) -> list:
    """Submit one job array, as the plugin's ``launch`` does."""
    from hydra.core.singleton import Singleton

    args = [(list(o), "hydra.sweep.dir", i, f"job_id_for_{i}", Singleton.get_state())
            for o, i in zip(overrides, idx)]  # fmt: skip
    return _executor(launcher).map_array(launcher, *zip(*args))


def plan_groups(
    launcher: str, cfgs: Sequence[Any], hydra_overrides: Sequence[str] = ()
) -> dict[tuple[str, ...], list[int]]:
    """Job indices grouped by allocation (:func:`resources`), in order of first use."""
    part, given = _partition(launcher, hydra_overrides), list(_launcher_keys(hydra_overrides))
    groups: dict[tuple[str, ...], list[int]] = {}
    for i, cfg in enumerate(cfgs):
        groups.setdefault(tuple(resources(launcher, cfg, part, given)), []).append(i)
    return groups


def check_groups(launcher: str, hydra_overrides: Sequence[str], cfgs: Sequence[Any]) -> None:
    """One ConfigError before submitting for a bad launcher key or value, or a request no
    node can satisfy, of any allocation ``cfgs`` need."""
    from omegaconf import OmegaConf

    check_launcher(launcher)
    part = _partition(launcher, hydra_overrides)
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
    """Submit every job (``cfgs``: their composed configs) through ``launcher`` and wait; exit
    status per job (0: ended, its run recorded by itself; 1: failed, killed or lost)."""
    check_launcher(launcher)
    sweep_dir = Path(sweep_dir) / time.strftime("%Y%m%d-%H%M%S")
    names = list(labels) if labels else [" ".join(j) for j in jobs]
    base = [f"hydra/launcher={launcher}", *hydra_overrides, f"hydra.sweep.dir={sweep_dir}",
            "hydra.sweep.subdir=${hydra.job.num}"]  # fmt: skip
    made = []
    for alloc, idx in plan_groups(launcher, cfgs, hydra_overrides).items():
        subs = _map_array(make_launcher([*base, *alloc], task), [jobs[i] for i in idx], idx)
        what = " ".join(alloc) or "this machine"
        log(f"submitted {len(subs)} job(s) through {launcher} ({what}): "
            + " ".join(str(s.job_id) for s in subs))  # fmt: skip
        made += list(zip(idx, subs))
        if is_slurm(launcher):
            note_jobs(sweep_dir.parent, [(str(s.job_id), names[i]) for i, s in zip(idx, subs)])
    log(f"jobs' Hydra output: {sweep_dir}")
    rcs = [1] * len(jobs)
    for (i, _), why in zip(made, wait_jobs([s for _, s in made], names, log)):
        rcs[i] = 0 if why is None else 1
    return rcs


# Slurm's states of a job that will not run again (a requeued or preempted job will)
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE")  # fmt: skip


def slurm_state(job_id: str) -> dict[str, str] | None:
    """``scontrol show job`` fields (no accounting needed); ``{}``: the controller has forgotten
    the job, None: it cannot be asked."""
    try:
        p = subprocess.run(["scontrol", "show", "job", "--oneliner", str(job_id)],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return {} if "Invalid job id" in p.stderr else None
    return dict(re.findall(r"(\w+)=(\S*)", p.stdout))


def describe_end(fields: dict[str, str]) -> str:
    code = fields.get("ExitCode", "?").split(":")
    out = f"{fields.get('JobState', '?')}, exit code {code[0]}"
    if len(code) > 1 and code[1] != "0":
        out += f", signal {code[1]}"
    reason = fields.get("Reason", "None")
    return out if reason in ("None", "") else f"{out}, reason {reason}"


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
    """(whether ``job`` has ended, None if it left a result else why not); on Slurm a job's
    end is the controller's word (submitit's ``sacct`` needs accounting)."""
    if slurm and job.paths.result_pickle.exists():
        # a requeued job (scontrol requeue, a node lost, a time limit) may have left its
        # first attempt's result: it has ended only when the controller says so
        fields = slurm_state(job.job_id)
        if fields and fields.get("JobState", "") not in ENDED:
            return False, None
    if job.paths.result_pickle.exists() or (not slurm and job.done()):
        try:
            err = job.exception()
        except Exception as e:  # noqa: BLE001  (submitit: no result, e.g. killed)
            err = e
        if err is None:
            return True, None
        return True, (str(err).strip().splitlines() or ["failed"])[-1][:200]
    fields = slurm_state(job.job_id) if slurm else None
    if fields is None or (fields and fields.get("JobState", "") not in ENDED):
        return False, None  # pending, running, requeued, or the controller not reachable
    end = describe_end(fields) if fields else "gone from the controller"
    time.sleep(1.0)  # the result is written before the job's end: one last look
    if job.paths.result_pickle.exists():
        return _outcome(job, slurm)
    return True, f"ended without a result ({end}); log: {log_tail(job)}"


def wait_jobs(jobs: Sequence[Any], names: Sequence[str], log: Callable[[str], None]) -> list:
    """Per job None, or why it failed."""
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


JOBS_FILE = "slurm-jobs.jsonl"  # beside a sweep's Hydra output: the Slurm jobs it submitted


def note_jobs(folder: Path, jobs: Sequence[tuple[str, str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    at = time.strftime("%Y-%m-%dT%H:%M:%S")
    with open(folder / JOBS_FILE, "a") as f:
        for job_id, label in jobs:
            f.write(json.dumps({"job_id": job_id, "label": label, "submitted_at": at}) + "\n")


def job_records(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(r["slurm"]["job_id"]): r for r in records if (r.get("slurm") or {}).get("job_id")}


def status_lines(
    folder: Path, records: Sequence[dict[str, Any]], state: Callable[[str], Any] | None = None
) -> list[str]:
    """One line per Slurm job noted under ``folder``: its state and the run it recorded."""
    jobs = []
    for path in sorted(Path(folder).rglob(JOBS_FILE)) if Path(folder).is_dir() else []:
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                jobs.append(json.loads(line))
    by_job = job_records(records)
    lines = []
    for job in sorted(jobs, key=lambda j: str(j.get("submitted_at", ""))):
        jid = str(job["job_id"])
        f = (state or slurm_state)(jid) if state or shutil.which("scontrol") else None
        if f is None:
            where = "controller not reachable"
        elif not f:
            where = "gone from the controller"
        elif f.get("JobState") in ENDED:
            where = describe_end(f)
        else:
            where = f.get("JobState", "?")
            if f.get("Reason") not in (None, "", "None"):
                where += f" ({f['Reason']})"
        if f and int(f.get("Restarts") or 0):
            where += f", requeued {f['Restarts']}x"
        rec = by_job.get(jid)
        what = "no record"
        if rec is not None:
            nodes = ",".join((rec.get("slurm") or {}).get("nodes") or []) or "?"
            what = (f"run {rec.get('run_id')} {rec.get('status')} (attempt "
                    f"{rec.get('attempt', 1)}) on {nodes}")  # fmt: skip
            if rec.get("status") in FAILED and rec.get("reason"):
                what += f": {str(rec['reason'])[:120]}"
        label = f" ({job['label']})" if job.get("label") else ""
        lines.append(f"slurm job {jid}{label}: {where}; {what}")
    return lines


def _requeued(task: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``task`` that, requeued, resumes the run its job recorded as interrupted (a new
    attempt) and never reruns a recorded one."""

    def run_task(cfg: Any) -> Any:
        from hydra.core.hydra_config import HydraConfig

        from bench.launch import run as runmod
        from bench.results import records

        job = records.slurm_job()
        prev = None
        if job and job["restarts"]:
            prev = job_records(records.load_records(str(cfg.results.dir))).get(job["job_id"])
        if prev is None:
            return task(cfg)
        run_id = prev["run_id"]
        if prev.get("status") not in FAILED:
            print(f"requeued job {job['job_id']}: run {run_id} is recorded "
                  f"({prev.get('status')}); not run again", flush=True)  # fmt: skip
            return prev.get("time_to_target_s")
        c = cfg.cluster  # each node of this allocation: its own rank and rendezvous
        overrides = [f"results.dir={cfg.results.dir}"]
        if c.name == "multinode":
            overrides += [f"cluster.node_rank={c.node_rank}", f"cluster.rdzv_id={c.rdzv_id}",
                          f"cluster.rdzv_endpoint={c.rdzv_endpoint}"]  # fmt: skip
        try:
            new_cfg, meta, path = runmod.prepare_resume(run_id, overrides, str(cfg.results.dir))
        except ConfigError as e:
            print(f"requeued job {job['job_id']}: run {run_id} not resumed ({e}); "
                  "it starts again", flush=True)  # fmt: skip
            return task(cfg)
        print(f"requeued job {job['job_id']} (restart {job['restarts']}): resuming run "
              f"{run_id} from {path} (attempt {meta['attempt']})", flush=True)  # fmt: skip
        _, rec = runmod.launch_and_record(new_cfg, meta, HydraConfig.get().runtime.output_dir)
        return rec.get("time_to_target_s") if rec else None

    return run_task


class SlurmLauncher(_SubmititSlurm):  # type: ignore[misc,valid-type]
    """hydra-submitit-launcher's Slurm launcher that refuses a request no node can satisfy
    and sees a job end without accounting: ``train -m`` never waits forever."""

    def __call__(self, *args: Any) -> Any:
        """One job: SIGUSR2 (the time limit near) stops it as ``interrupted``, to be resumed."""
        from bench.launch.run import Interrupted

        def near_end(signum: int, frame: Any) -> None:  # noqa: ARG001
            raise Interrupted("SIGUSR2 (the job's time limit or a preemption is near)")

        task = self.task_function
        self.task_function = _requeued(task)
        old = signal.signal(signal.SIGUSR2, near_end)
        try:
            return super().__call__(*args)
        finally:
            signal.signal(signal.SIGUSR2, old)
            self.task_function = task

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        from hydra.core.utils import JobReturn, JobStatus, filter_overrides

        try:
            check_fit(self.params, partition_info(self.params.get("partition")))
        except ConfigError as e:  # one line, before anything is submitted
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        idx = range(initial_job_idx, initial_job_idx + len(job_overrides))
        jobs = _map_array(self, job_overrides, idx)
        names = [" ".join(filter_overrides(o)) for o in job_overrides]
        note_jobs(sweep_dir, [(str(j.job_id), n) for j, n in zip(jobs, names)])
        print(f"submitted {len(jobs)} job(s) to Slurm: "
              + " ".join(str(j.job_id) for j in jobs), flush=True)  # fmt: skip
        whys = wait_jobs(jobs, names, lambda m: print(m, flush=True))
        return [
            j.results()[0] if why is None
            else JobReturn(overrides=list(o), status=JobStatus.FAILED,
                           _return_value=RuntimeError(f"job {j.job_id}: {why}"))
            for j, o, why in zip(jobs, job_overrides, whys)
        ]  # fmt: skip
