"""One run from a composed config: validate, launch the workers with the launcher
``cluster.name`` names, and leave a record whatever happened (a failed launch: ``error``)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout
from omegaconf import DictConfig, OmegaConf

from bench import data, models, optim, sync
from bench.cluster import emulated, torchrun
from bench.comm import is_sparse
from bench.config import Config, ResultsConfig, from_container, to_container, to_object
from bench.data.config import train_sizes
from bench.launch import profile
from bench.registry import ConfigError
from bench.results import columns as col
from bench.results import events as ev
from bench.results import mllog, records, reserve, whole
from bench.results.env import git_sha
from bench.results.outputs import closing_lines
from bench.results.safejson import non_finite
from bench.train import checkpoint as ck
from bench.train import comm
from bench.train.workload import WORKLOADS

#: cluster.name -> (start this node's workers, the launcher's own config checks)
LAUNCHERS = {
    "local": (torchrun.launch_local, lambda c: None),
    "multinode": (torchrun.launch_multinode, torchrun.check_multinode),
    "emulated": (emulated.launch_emulated, emulated.check_emulated),
}
SEED_MAX = 2**32 - 1  # numpy's and scikit-learn's seeds are 32-bit
# s: rank 0 alone evaluates, checkpoints and writes the record between two collectives
# while the other ranks wait under comm.timeout_s (1 s failed at a tiny run's end on 2 cores)
MIN_COMM_TIMEOUT_S = 10.0
FAILED = ("error", "interrupted")  # a record's statuses that make the launcher exit non-zero


def check_cluster(cfg: Config) -> None:
    c = cfg.cluster
    if c.name not in LAUNCHERS:
        raise ConfigError(
            f"unknown cluster launcher {c.name!r}; choose one of: {', '.join(sorted(LAUNCHERS))}"
        )
    if c.nproc_per_node < 1:
        raise ConfigError(f"cluster.nproc_per_node must be >= 1, got {c.nproc_per_node}")
    if c.nnodes < 1:
        raise ConfigError(f"cluster.nnodes must be >= 1, got {c.nnodes}")
    LAUNCHERS[c.name][1](c)


def launch_workers(cfg: Config, run_json: Path) -> int:
    return LAUNCHERS[cfg.cluster.name][0](cfg.cluster, Path(run_json))


def validate(cfg: Config, *, create_results: bool = True) -> None:
    """Every check before any worker starts (``create_results=False``: a dry run's)."""
    # first: a range check such as ``lr > 0`` passes inf, and every check passes NaN
    bad = non_finite(to_container(cfg))
    if bad:
        raise ConfigError(
            "not a finite number: "
            + ", ".join(f"{k}={v}" for k, v in bad)
            + " (every number of the config must be finite)"
        )
    check_cluster(cfg)
    profile.check(cfg.cluster.profile, cfg.cluster.name)
    world = cfg.cluster.nnodes * cfg.cluster.nproc_per_node
    models.validate(cfg.model)
    data.validate(cfg.data, cfg.cache, world)
    optim.validate(cfg.optim)
    comm.validate(cfg.comm, world, cfg.cluster.nnodes, optim=cfg.optim, amp=cfg.train.amp)
    if sync.is_outer(cfg.sync.name):  # the fragments are cut from the model's tensors
        sync.validate(
            cfg.sync,
            param_tensors=sync.parameter_tensors(cfg.model),
            comm=cfg.comm.name,
            update=str(cfg.optim.update),
            amp=_amp_dtype(cfg.train),
            master_weights=str(cfg.optim.master_weights),
        )
    _validate_train(cfg)
    _check_fit(cfg)
    check_results_dir(cfg.results.dir, create=create_results)
    cost = cfg.results.cost_per_hour
    if cost is not None and not cost >= 0:
        raise ConfigError(f"results.cost_per_hour is USD per hour, >= 0; got {cost}")


def _amp_dtype(t: object) -> str:
    """``train.amp`` as it will resolve: ``auto`` is bf16 when training on CUDA, else off."""
    amp = str(t.amp)
    if amp != "auto":
        return amp
    cuda = str(t.device) in ("auto", "cuda") and torch.cuda.is_available()
    return "bf16" if cuda else "off"


def _validate_train(cfg: Config) -> None:
    t = cfg.train
    metrics = [m for m in WORKLOADS.get(t.workload).metrics if m != "loss"]
    if t.target_metric not in metrics:
        raise ConfigError(
            f"train.target_metric={t.target_metric!r}; workload {t.workload} reports "
            f"{', '.join(metrics)}"
        )
    if t.epochs < 1:
        raise ConfigError(f"train.epochs must be >= 1, got {t.epochs}")
    if not 0 < t.target_value <= 1:
        raise ConfigError(f"train.target_value is a fraction in (0, 1], got {t.target_value}")
    mw = cfg.optim.master_weights
    if mw != "off" and _amp_dtype(t) != mw:
        raise ConfigError(
            f"optim.master_weights={mw} keeps a {mw} model copy: set train.amp={mw} too "
            "(train.amp=auto is bf16 on CUDA only)"
        )
    if t.max_steps_per_epoch < 0:  # else a negative limit would silently mean none
        raise ConfigError(
            f"train.max_steps_per_epoch must be >= 0 (0 = whole epochs), "
            f"got {t.max_steps_per_epoch}"
        )
    if t.eval_every < 1:
        raise ConfigError("train.eval_every must be >= 1")
    if t.eval_from_step < 0 or t.eval_stride < 1:
        raise ConfigError(
            f"train.eval_from_step must be >= 0 and train.eval_stride >= 1, "
            f"got {t.eval_from_step} and {t.eval_stride}"
        )
    if t.eval_stride > 1 and not (t.eval_every_steps > 0 and t.stop_at_target):
        raise ConfigError(
            "train.eval_stride > 1 needs train.eval_every_steps > 0 and "
            "train.stop_at_target=true (it finds the first step at the target, then stops)"
        )
    if t.checkpoint_every < 0 or t.keep_checkpoints < 1:
        raise ConfigError(
            "train.checkpoint_every must be >= 0 (0 = no checkpoints) and "
            f"train.keep_checkpoints >= 1, got {t.checkpoint_every} and {t.keep_checkpoints}"
        )
    for key, seed in (("train.seed", t.seed), ("data.split_seed", cfg.data.split_seed)):
        if not 0 <= seed <= SEED_MAX:
            raise ConfigError(f"{key} must be in 0..{SEED_MAX} (2**32 - 1), got {seed}")
    c = cfg.cluster
    if cfg.comm.timeout_s <= 0 or c.rdzv_timeout_s <= 0 or c.max_restarts < 0:
        raise ConfigError(
            "comm.timeout_s and cluster.rdzv_timeout_s must be > 0 and cluster.max_restarts "
            f">= 0, got {cfg.comm.timeout_s}, {c.rdzv_timeout_s} and {c.max_restarts}"
        )


def _check_fit(cfg: Config) -> None:
    """What only the workers would find out: a comm timeout, an image size that cannot fit."""
    if cfg.comm.timeout_s < MIN_COMM_TIMEOUT_S:
        raise ConfigError(
            f"comm.timeout_s={cfg.comm.timeout_s:g} is shorter than the workers wait for each "
            f"other between collectives (evaluation, checkpoints): give >= {MIN_COMM_TIMEOUT_S:g}"
        )
    if cfg.train.workload != "classification":  # images: the model's input is checked
        return
    c, d = cfg.cluster, cfg.data
    here = c.nproc_per_node * (1 if c.name == "multinode" else c.nnodes)  # on this machine
    # the activations are in this machine's memory when it trains on the CPU: asked for,
    # or no device asked and none here (train.device=cuda keeps them on the GPU it names)
    device = str(cfg.train.device)
    cpu = device == "cpu" or (device != "cuda" and not torch.cuda.is_available())
    batch, free = d.batch_size // (c.nproc_per_node * c.nnodes), emulated.available_memory()
    for size in sorted({*train_sizes(d), d.eval_image_size}):
        act = models.input_bytes(cfg.model, d.num_classes, d.channels, size)
        need = here * (data.memory_bytes(d, size) + (act * batch if cpu else 0))
        if free is not None and need > free:
            raise ConfigError(
                f"data.image_size={size}: {here} worker(s) need at least {need / 2**30:.1f} GiB "
                f"of memory for the data and a batch of model={cfg.model.name}, "
                f"{free / 2**30:.1f} GiB is available"
            )


def check_results_dir(results_dir: str, *, create: bool = True) -> None:
    """Refuse a results directory the run could not write to; ``create`` (not in a dry run)
    makes it and writes a scratch file in it."""
    res = Path(results_dir)
    where = f"results.dir={results_dir!r}"
    if not str(results_dir).strip():
        raise ConfigError(f"{where} is empty: name a directory (default {ResultsConfig.dir})")
    for p in [res, *res.absolute().parents]:
        if p.is_symlink() and not p.exists():
            raise ConfigError(f"{where}: {p} is a dangling link (to {os.readlink(p)})")
    existing = next(p for p in [res, *res.absolute().parents] if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"{where} is not a directory ({existing} is a file)")
    try:  # no access, a file system that takes no files (/proc), read-only, full: a scratch file
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".bench-check-"):
            pass
    except OSError as e:
        raise ConfigError(f"{where} is not writable ({existing}: {e.strerror})") from None
    runs = records.runs_path(res)
    if runs.exists() and not (runs.is_file() and os.access(runs, os.W_OK)):
        raise ConfigError(f"{where}: its {runs.name} is not a writable file")
    # the record is appended to runs.jsonl (under its lock file): opened for appending, as
    # the writer will (root passes os.access; a read-only mount or file does not open)
    for f in (runs, Path(f"{runs}.lock")):
        if f.exists():
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_APPEND))  # opened, nothing written
            except OSError as e:
                raise ConfigError(f"{f} is not writable ({e.strerror})") from None
    if not create:
        return
    try:
        res.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=res):
            pass
    except OSError as e:
        raise ConfigError(f"{where} is not writable ({e.strerror})") from None


def run(
    cfg: DictConfig | Config,
    *,
    experiment: str,
    output_dir: str | Path | None = None,
    checked: bool = False,
) -> tuple[int, dict[str, Any] | None]:
    launch_time, cfg = time.time(), to_object(cfg)
    return launch_and_record(
        cfg, prepare(cfg, experiment, launch_time, checked=checked), output_dir
    )


def prepare(
    cfg: Config, experiment: str, launch_time: float, quiet: bool = False, checked: bool = False
) -> dict[str, Any]:
    """Validate ``cfg``, set its emulated link (``cluster.profile``); the run's metadata."""
    if checked:  # some checks read whole files (a corpus, a tokenizer): not twice
        check_results_dir(cfg.results.dir)
    else:
        validate(cfg)
    multi = cfg.cluster.name == "multinode"  # every node's launcher: the job's one run id
    run_meta = {
        "run_id": records.job_run_id(cfg.results.dir) if multi else records.new_run_id(),
        "started_at": records.now_iso(),
        "launch_time": launch_time,
        "experiment": experiment,
    }
    prof = profile.apply(cfg)  # sets the emulated link before anything is launched
    if prof is not None:
        run_meta["cluster_profile"] = prof
        if not quiet:
            print(profile.describe(prof), flush=True)
    return run_meta


def resume(
    run_id: str, overrides: list[str], results_dir: str = ResultsConfig.dir
) -> tuple[int, dict[str, Any] | None]:
    """Continue run ``run_id`` from its last checkpoint as a new ``attempt`` of its record
    (``overrides``: only what ``bench.train.checkpoint.MAY_DIFFER`` lists)."""
    with resume_lock(_results_dir(overrides, results_dir), run_id):
        cfg, run_meta, path = prepare_resume(run_id, overrides, results_dir)
        print(f"resuming run {run_id} from {path} (attempt {run_meta['attempt']})", flush=True)
        return launch_and_record(cfg, run_meta, None)


@contextlib.contextmanager
def resume_lock(results_dir: str, run_id: str) -> Iterator[None]:
    path = Path(f"{ck.run_dir(results_dir, run_id)}.lock")
    if not path.parent.is_dir():
        yield
        return
    try:
        held = FileLock(str(path)).acquire(timeout=0)
    except Timeout:
        raise ConfigError(
            f"run {run_id} is being resumed by another process (it holds {path}); "
            "wait for it to end"
        ) from None
    with held:
        yield


def _results_dir(overrides: list[str], default: str) -> str:
    return next((o.split("=", 1)[1] for o in overrides if o.startswith("results.dir=")), default)


def prepare_resume(
    run_id: str, overrides: list[str], results_dir: str = ResultsConfig.dir, dry: bool = False
) -> tuple[Config, dict[str, Any], str]:
    """The checks of :func:`resume` (``dry``: nothing created): config, metadata, checkpoint."""
    results_dir = _results_dir(overrides, results_dir)
    skipped: list[str] = []
    manifest = ck.latest(results_dir, run_id, skipped)
    if manifest is None and skipped:
        raise ConfigError(f"run {run_id} has no intact checkpoint: {'; '.join(skipped)}")
    for line in skipped:
        print(f"warning: damaged checkpoint skipped: {line}", file=sys.stderr, flush=True)
    if manifest is None:
        raise ConfigError(
            f"run {run_id} has no checkpoint under {ck.run_dir(results_dir, run_id)} "
            "(results.dir=... names another results directory)"
        )
    done = [r for r in records.load_records(results_dir, attempts=True) if r["run_id"] == run_id]
    if done and done[-1]["status"] not in ("interrupted", "error"):
        raise ConfigError(f"run {run_id} has finished (status {done[-1]['status']})")
    try:
        merged = OmegaConf.merge(manifest["config"], OmegaConf.from_dotlist(overrides))
        cfg = from_container(OmegaConf.to_container(merged))  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001  (a bad override: one line)
        raise ConfigError(f"resume={run_id}: {str(e).splitlines()[0]}") from None
    ck.check_compatible(manifest, to_container(cfg))
    validate(cfg, create_results=not dry)
    attempt = max((r.get("attempt", 1) for r in done), default=0) + 1
    shas = (done[-1].get("git_shas") or [r.get("git_sha") for r in done]) if done else []
    if {s for s in shas if s} - {git_sha()}:  # the same shapes resume silently otherwise
        print(
            f"warning: run {run_id} ran the code of {', '.join(dict.fromkeys(map(str, shas)))}; "
            f"attempt {attempt} runs {git_sha()}",
            file=sys.stderr,
            flush=True,
        )
    run_meta = {**manifest["run"], "resume": True, "attempt": attempt, "git_shas": shas}
    return cfg, run_meta, str(manifest["path"])


class Interrupted(BaseException):
    """SIGTERM (or SIGINT) reached the launcher."""


def _on_signal(signum: int, frame: Any) -> None:  # noqa: ARG001
    raise Interrupted(signal.Signals(signum).name)


def guarded_launch(cfg: Config, run_json: Path) -> tuple[int, str, str | None, Exception | None]:
    """(exit status, status, reason, the launcher's exception to raise after recording)."""
    try:
        old = signal.signal(signal.SIGTERM, _on_signal)
    except ValueError:  # not the main thread (a threaded sweep): the caller handles signals
        old = None
    status, reason, raised = "error", None, None
    try:
        rc = launch_workers(cfg, run_json)
    except (KeyboardInterrupt, Interrupted) as e:
        rc, status, reason = 130, "interrupted", f"interrupted by {e or 'SIGINT'}"
    except SystemExit as e:  # a launcher's own signal handler (the emulated cluster's)
        if e.code not in (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP):
            raise
        sig = signal.Signals(int(e.code) - 128).name  # type: ignore[arg-type]
        rc, status, reason = 130, "interrupted", f"interrupted by {sig}"
    except Exception as e:  # noqa: BLE001  (recorded, then raised again)
        # a full disk names the file and its disk (whole.write names the file meant)
        rc, raised = 1, e
        reason = reserve.no_space(e, cfg.results.dir) or f"{type(e).__name__}: {e}"
        if type(e).__name__ == "SignalException":  # torch's agent got the signal first
            sig = getattr(e, "sigval", None)
            name = signal.Signals(sig).name if sig is not None else str(e)
            status, reason, raised, rc = "interrupted", f"interrupted by {name}", None, 130
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    return rc, status, reason, raised


def write_run_json(out: Path, payload: dict[str, Any]) -> Path:
    """``out/run-<run id>.json`` for the workers (``.node<k>.json`` on node k > 0 of a
    multi-node run, whose nodes share the run id and may share ``out``)."""
    out.mkdir(parents=True, exist_ok=True)
    c = payload["config"]["cluster"]
    node = int(c.get("node_rank") or 0) if c.get("name") == "multinode" else 0
    path = out / f"run-{payload['run']['run_id']}{f'.node{node}' if node else ''}.json"
    whole.write(path, json.dumps(payload, indent=1))
    return path


def launch_and_record(
    cfg: Config, run_meta: dict[str, Any], output_dir: str | Path | None
) -> tuple[int, dict[str, Any] | None]:
    payload = {"config": to_container(cfg), "run": run_meta}
    out = Path(output_dir) if output_dir else Path(tempfile.mkdtemp(prefix="bench-run-"))
    try:
        launched = launch_runs([cfg], [payload], write_run_json(out, payload))
    finally:
        if not output_dir:  # our own temporary folder (a resume's): its workers are done
            shutil.rmtree(out, ignore_errors=True)
    if launched.raised is not None:
        raise launched.raised
    rec = launched.records[0]
    return launched.rc or int(rec is not None and rec["status"] in FAILED), rec


@dataclass
class Launched:
    """One launch; per run up to the one training when it ended: its record (None off node
    0) and whether the workers wrote it."""

    rc: int
    status: str
    raised: Exception | None
    records: list[dict[str, Any] | None]
    by_workers: list[bool]


def launch_runs(
    cfgs: list[Config],
    payloads: list[dict[str, Any]],
    launch_json: Path,
    agent_log: Path | None = None,
) -> Launched:
    """Launch ``launch_json`` (a run's or a queue's); record the run training when the launch
    ended if its workers did not (with ``agent_log``'s notes)."""
    since = time.time()
    # room for the record of a run the workers could not record, should the disk fill up
    room = reserve.hold(cfgs[0].results.dir, launch_json.stem)
    try:
        rc, status, reason, raised = guarded_launch(cfgs[0], launch_json)
    finally:
        room.release()
    dirs = {c.results.dir for c in cfgs}
    recorded = {r["run_id"]: r for d in dirs for r in records.load_records(d)}
    out = Launched(rc, status, raised, [], [])
    for cfg, payload in zip(cfgs, payloads):
        meta = payload["run"]
        rec = recorded.get(meta["run_id"])
        if rec is not None and rec.get("attempt", 1) == meta.get("attempt", 1):
            out.records.append(rec)
            out.by_workers.append(True)
            continue
        if agent_log is not None:  # the agents' notes of this launch, in the run's log
            for e in ev.read_events(agent_log):
                if e.get("time", 0) >= since:
                    fields = {k: v for k, v in e.items() if k != "time"}
                    ev.log_event(ev.events_path(cfg.results.dir, meta["run_id"]), **fields)
        exit_status = rc if len(cfgs) == 1 else rc or 1  # a queue's run left unrecorded failed
        out.records.append(record_after(cfg, payload, exit_status, status, reason, since))
        out.by_workers.append(False)
        break
    done = [r for r in out.records if r is not None]
    finished = all(out.by_workers) and all(r["status"] not in FAILED for r in done)
    if rc and status == "error" and raised is None and finished:
        # a process that hung after the workers recorded every run: the records stand, and
        # the launcher's exit status says what they say
        events = ev.events_env(launch_json)[ev.EVENTS_ENV]
        for e in ev.read_events(events):
            if e.get("kind") == torchrun.STOPPED and e.get("time", 0) >= since:
                print(f"note: {e['reason']}, after the workers recorded the run "
                      f"({done[-1]['status']})", file=sys.stderr, flush=True)  # fmt: skip
        out.rc = 0
    return out


def record_after(
    cfg: Config, payload: dict[str, Any], rc: int, status: str, reason: str | None, since: float
) -> dict[str, Any] | None:
    meta = payload["run"]
    rec = records.find_record(cfg.results.dir, meta["run_id"])
    if rec is not None and rec.get("attempt", 1) == meta.get("attempt", 1):
        return rec
    log = ev.events_path(cfg.results.dir, meta["run_id"])
    now = [e for e in ev.read_events(log) if e["time"] >= since]
    stopped = [e["reason"] for e in now if e.get("kind") == torchrun.STOPPED]  # the cause first
    if cfg.cluster.name == "multinode" and cfg.cluster.node_rank != 0:
        for line in stopped:  # node 0 records the run; this node says what it ended
            print(f"error: {line}", file=sys.stderr, flush=True)
        return None
    reason = reason or "; ".join([*stopped, ev.failure_reason(now, rc)])
    if status == "interrupted":
        ev.log_event(log, kind=ev.STOP, reason=reason)
    err = records.RunRecord.start(
        cfg, meta, config=payload["config"], comm_sparse=is_sparse(cfg.comm.name)
    )
    curve_file = records.curve_path(cfg.results.dir, meta["run_id"])
    curve = records.read_curve(curve_file).to_dict("records") if curve_file.exists() else []
    if curve:
        err = err.finish(
            curve,
            status=status,
            train_time_s=float(curve[-1][col.TRAIN_TIME]),
            world_size=err.world_size,
            launch_time=meta["launch_time"],
        )
        err.curve = str(curve_file)
    err.status, err.exit_status, err.reason = status, rc, reason
    ck.remove_incomplete(ck.run_dir(cfg.results.dir, meta["run_id"]))  # the workers are gone
    last = ck.latest(cfg.results.dir, meta["run_id"])
    try:  # the workers died before their record: end their MLPerf log (run_stop aborted)
        records.settle(
            err,
            cfg.results.dir,
            curve,
            checkpoint=last["path"] if last else None,
            mllog=lambda: mllog.close_after_failure(cfg.results.dir, err.run_id, reason or status),
        )
    except OSError as e:  # a full disk: the record itself matters more than these files
        print(f"note: the run's MLPerf/DAWNBench files are incomplete ({e})", file=sys.stderr)
    err.append(cfg.results.dir)
    print(f"{status}: {reason}", file=sys.stderr, flush=True)
    print(closing_lines(err.to_dict(), cfg.results.dir), file=sys.stderr, flush=True)
    if last is not None:
        print(
            f"the last checkpoint is epoch {last['epoch']}; continue with: python -m reproduce "
            f"train resume={meta['run_id']} {shlex.quote(f'results.dir={cfg.results.dir}')}",
            file=sys.stderr,
            flush=True,
        )
    return err.to_dict()
