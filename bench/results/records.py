"""Run records: a JSON line per run in ``<dir>/runs.jsonl`` (:class:`RunRecord`, appended
under a file lock, never rewritten), a curve CSV per run (docs/internals/results.md)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import re
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from filelock import FileLock

from bench.results import columns as col
from bench.results import safejson, whole
from bench.results.env import git_sha, hardware, versions
from bench.results.timing import best_value, time_to_target_steps

STATUSES = ("ok", "target_missed", "diverged", "error", "interrupted")


def new_run_id() -> str:
    """``YYYYmmdd-HHMMSS-<6 hex>``: sorts by start time, unique across machines."""
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


JOB_RUN_ID_ENV = "BENCH_RUN_ID"  # a multi-node job's one run id (conf/hydra/launcher/slurm.yaml)
RUN_ID_FORM = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")


def job_run_id(results_dir: str | Path) -> str:
    """``$BENCH_RUN_ID``, so that every node names the one run; a new id where the job chose
    none or that id has a record already."""
    given = os.environ.get(JOB_RUN_ID_ENV, "")
    if RUN_ID_FORM.match(given) and find_record(results_dir, given) is None:
        return given
    return new_run_id()


def now_iso() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def runs_path(results_dir: str | Path) -> Path:
    return Path(results_dir) / "runs.jsonl"


def curve_path(results_dir: str | Path, run_id: str) -> Path:
    return Path(results_dir) / "curves" / f"{run_id}.csv"


def figure_path(results_dir: str | Path, run_id: str) -> Path:
    return Path(results_dir) / "curves" / f"{run_id}_tta.png"


class AlreadyRecorded(ValueError):
    """This attempt of this run already has its record."""


def append_record(results_dir: str | Path, record: Mapping[str, Any]) -> Path:
    """Append one record whole or not at all (:class:`whole.NotAppended`); a second record of
    the same run and ``attempt``: :class:`AlreadyRecorded`."""
    missing = [f for f in ("run_id", "status") if f not in record]
    if missing:
        raise ValueError(f"record lacks {missing}")
    if record["status"] not in STATUSES:
        raise ValueError(f"status {record['status']!r} not in {STATUSES}")
    path = runs_path(results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    line, unencodable = safejson.encode(record)  # never fails: a record is not lost
    line += "\n"
    if unencodable:
        warnings.warn(
            f"run {record['run_id']}: {', '.join(unencodable)} recorded as strings (not "
            f"JSON numbers), listed in the record's {safejson.NOTE_FIELD!r} field",
            stacklevel=2,
        )
    attempt = record.get("attempt", 1)
    with FileLock(str(path) + ".lock"):
        for old in _read_lines(path, warn=False):
            if old.get("run_id") == record["run_id"] and old.get("attempt", 1) == attempt:
                raise AlreadyRecorded(
                    f"run {record['run_id']} (attempt {attempt}) is already in {path}"
                )
        # O_APPEND: the line lands after everything already there, never over it
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                line = "\n" + line  # a torn last line stays alone on its line
            whole.append(fd, line.encode(), what=f"{path} (run {record['run_id']})")
        finally:
            os.close(fd)
    return path


def write_curve(
    results_dir: str | Path, run_id: str, rows: Iterable[Mapping[str, Any]], *, extend: bool = False
) -> Path:
    """A run's curve CSV, atomically; never replaced, except with ``extend`` by its own."""
    path = curve_path(results_dir, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pd.DataFrame(rows).to_csv(tmp, index=False)  # in the try: a partial file is removed
        if extend and path.exists():
            # the run's own curve: epochs 1..n, replaced by epochs 1..m (m < n when a
            # restart repeats the epochs after its checkpoint)
            old = pd.read_csv(path)
            new = [r.get(col.EPOCH) for r in rows]
            if not _from_one(list(old.get(col.EPOCH, []))) or not _from_one(new):
                raise FileExistsError(f"{path} holds another curve; it is not replaced")
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # fails if the curve exists: never replace a recorded curve
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _from_one(epochs: list[Any]) -> bool:
    return bool(epochs) and epochs == list(range(1, len(epochs) + 1))


def _read_lines(path: Path, warn: bool = True) -> list[dict[str, Any]]:
    """Every record of ``path``; a line that is not one (a torn line, a hand edit) is skipped
    with a warning."""
    if not path.exists():
        return []
    out = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw.decode("utf-8"))
                why = "" if isinstance(rec, dict) else "not an object"
                why = why or ("" if isinstance(rec.get("run_id"), str) else "no run_id")
            except UnicodeDecodeError as e:
                why = f"not UTF-8 at byte {e.start}"
            except json.JSONDecodeError as e:
                why = e.msg
            if not why:
                out.append(rec)
            elif warn:
                warnings.warn(f"{path}:{n}: skipped, not a run record ({why})", stacklevel=3)
    return out


def load_records(results_dir: str | Path, *, attempts: bool = False) -> list[dict[str, Any]]:
    """The records in order, each run's latest attempt (``attempts=True``: every one)."""
    recs = _read_lines(runs_path(results_dir))
    if attempts:
        return recs
    latest: dict[str, int] = {}
    for i, r in enumerate(recs):
        key = str(r.get("run_id"))
        if key not in latest or r.get("attempt", 1) >= recs[latest[key]].get("attempt", 1):
            latest[key] = i
    keep = set(latest.values())
    return [r for i, r in enumerate(recs) if i in keep]


def find_record(results_dir: str | Path, run_id: str) -> dict[str, Any] | None:
    return next((r for r in load_records(results_dir) if r.get("run_id") == run_id), None)


def load_curve(results_dir: str | Path, run_id: str) -> pd.DataFrame:
    return read_curve(curve_path(results_dir, run_id))


def read_curve(path: str | Path) -> pd.DataFrame:
    """A curve with today's column names."""
    return pd.read_csv(path).rename(columns=col.RENAMES)


def _mean(curve: Sequence[Mapping[str, Any]], key: str) -> float | None:
    vals = [
        r[key] for r in curve if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])
    ]
    return sum(vals) / len(vals) if vals else None


@dataclasses.dataclass
class RunRecord:
    """One line of ``runs.jsonl`` (the outcome fields stay ``None`` in an ``error`` record whose
    workers died before reporting)."""

    run_id: str
    started_at: str
    status: str
    experiment: str
    model: str
    data: str
    comm: str
    comm_density: float  # 1.0 for the dense methods
    comm_warmup_epochs: int
    comm_density_schedule: list[float]
    update: str
    optimizer: str
    cache: str
    loader: str
    world_size: int
    nnodes: int
    target_metric: str
    target_value: float
    best_value: float | None = None
    time_to_target_s: float | None = None
    epochs_to_target: int | None = None
    epochs_run: int = 0
    # damaged images skipped (data.strict=false), every worker's, over the epochs run
    images_skipped: int | None = None
    train_time_s: float | None = None
    wall_time_s: float | None = None
    throughput_samples_per_s: float | None = None
    # source + target tokens (non-pad) per second of training time (None for images)
    throughput_tokens_per_s: float | None = None
    step_time_s: float | None = None  # data + compute + update, s per step
    data_share: float | None = None
    update_share: float | None = None
    comm_bytes_per_step: float | None = None
    comm_inter_node_bytes_per_step: float | None = None
    select_s_per_step: float | None = None
    comm_s_per_step: float | None = None
    # the run's steps by the phase each was sent in, run-length in step order: [{method,
    # density, rank, steps, bytes_per_step}] from the curve's comm/phases (None: not logged)
    comm_phases: list[dict[str, Any]] | None = None
    curve: str | None = None
    figure: str | None = None
    translations: str | None = None  # translation: the last evaluation's decoded output
    # DAWNBench submission files (bench.results.dawnbench) and the MLPerf log (.mllog)
    dawnbench_json: str | None = None
    dawnbench_tsv: str | None = None
    mllog: str | None = None
    exit_status: int | None = None  # the launcher's, when the workers failed
    reason: str | None = None  # why an error, interrupted or diverged run stopped
    attempt: int = 1  # 1, then + 1 for each resume by hand (the latest record counts)
    restarts: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # elastic
    checkpoint: str | None = None  # the last checkpoint (resume from it)
    diverged_at: dict[str, Any] | None = None  # step and place of the first NaN/Inf
    link_check: dict[str, Any] | None = None
    machine_load: dict[str, Any] | None = None  # rank 0's machine: bench.train.progress
    # cluster=emulated: each node's link counters per step (bench.cluster.emulated.link_bytes)
    link_bytes: dict[str, Any] | None = None
    cluster_profile: dict[str, Any] | None = None  # the link profile's measurement and choice
    queue: dict[str, Any] | None = None  # run queue: id, index, size, label (bench.launch.runqueue)
    # a tuning-protocol run: {"name", "role", "trial", "selected"} (bench.sweeps.protocol)
    protocol: dict[str, Any] | None = None
    # a run inside a Slurm job: {"job_id", "nodes", "node", "restarts"} (:func:`slurm_job`)
    slurm: dict[str, Any] | None = None
    # with train.eval_every_steps: optimizer steps to target, and the sub-epoch evaluations
    steps_to_target: int | None = None
    evals: list[dict[str, Any]] | None = None
    git_sha: str | None = None
    git_shas: list[str | None] = dataclasses.field(default_factory=list)  # each attempt's
    torch_version: str = ""
    versions: dict[str, Any] = dataclasses.field(default_factory=dict)
    hardware: str = ""
    config: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def start(
        cls,
        cfg: Any,
        run: Mapping[str, Any],
        *,
        config: dict[str, Any],
        comm_sparse: bool,
        nnodes: int | None = None,
    ) -> RunRecord:
        """Everything known before training (``config``: ``cfg`` as a plain dict)."""
        import torch  # deferred: seconds to load, and this module is read without it

        c = cfg.cluster
        return cls(
            run_id=run["run_id"],
            started_at=run["started_at"],
            status="error",
            experiment=run.get("experiment") or cfg.experiment,
            model=cfg.model.name,
            data=cfg.data.name,
            comm=cfg.comm.name,
            comm_density=float(cfg.comm.density) if comm_sparse else 1.0,
            comm_warmup_epochs=int(cfg.comm.warmup_epochs),
            comm_density_schedule=[float(d) for d in cfg.comm.density_schedule],
            update=str(cfg.optim.update),
            optimizer=cfg.optim.name,
            cache=cfg.cache.name,
            loader=str(cfg.data.loader),
            world_size=c.nnodes * c.nproc_per_node,
            nnodes=nnodes or c.nnodes,
            target_metric=str(cfg.train.target_metric),
            target_value=float(cfg.train.target_value),
            wall_time_s=time.time() - run["launch_time"],
            attempt=int(run.get("attempt", 1)),
            cluster_profile=run.get("cluster_profile"),
            queue=run.get("queue"),
            protocol=_protocol(cfg.results),
            slurm=slurm_job(),
            git_sha=git_sha(),
            git_shas=[*run.get("git_shas", []), git_sha()],
            torch_version=torch.__version__,
            versions=versions(),
            hardware=hardware(),
            config=config,
        )

    def finish(
        self,
        curve: Sequence[Mapping[str, Any]],
        *,
        status: str,
        train_time_s: float,
        world_size: int,
        launch_time: float,
        evals: Sequence[Mapping[str, Any]] | None = None,
    ) -> RunRecord:
        metric, target = self.target_metric, self.target_value
        tt, et, st = time_to_target_steps(curve, evals or (), metric, target)
        samples = sum(r.get(col.SAMPLES, 0) for r in curve)
        tokens = [v for r in curve if (v := r.get(col.TOKENS)) is not None and v == v]
        skipped = [v for r in curve if (v := r.get(col.SKIPPED)) is not None and v == v]
        step_s = sum(
            _mean(curve, k) or 0.0 for k in ("time/data_s", "time/compute_s", "time/update_s")
        )
        return dataclasses.replace(
            self,
            status=status,
            world_size=world_size,
            best_value=best_value(curve, metric),
            time_to_target_s=tt,
            epochs_to_target=et,
            steps_to_target=st,
            evals=[dict(e) for e in evals] if evals else None,
            epochs_run=len(curve),
            images_skipped=int(sum(skipped)) if skipped else None,
            train_time_s=train_time_s,
            wall_time_s=time.time() - launch_time,
            throughput_samples_per_s=samples / train_time_s if train_time_s > 0 else None,
            throughput_tokens_per_s=(
                sum(tokens) / train_time_s if tokens and train_time_s > 0 else None
            ),
            step_time_s=step_s,
            data_share=(_mean(curve, "time/data_s") or 0.0) / step_s if step_s else None,
            update_share=(_mean(curve, "time/update_s") or 0.0) / step_s if step_s else None,
            comm_bytes_per_step=_mean(curve, "comm/bytes_per_step"),
            comm_inter_node_bytes_per_step=_mean(curve, "comm/inter_node_bytes_per_step"),
            select_s_per_step=_mean(curve, "time/select_s"),
            comm_s_per_step=_mean(curve, "time/comm_s"),
            comm_phases=_phases(curve),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def append(self, results_dir: str | Path) -> Path:
        return append_record(results_dir, self.to_dict())


def _phases(curve: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The curve's per-epoch phase logs joined over the run (None: none logged)."""
    from bench.comm.stats import merge, parse_phases  # the worker has torch loaded already

    segs = merge([s for r in curve for s in parse_phases(r.get(col.COMM_PHASES))])
    if not segs:
        return None
    return [
        {
            **{k: getattr(s, k) for k in ("method", "density", "rank", "steps")},
            "bytes_per_step": round(s.bytes_per_step),
        }
        for s in segs
    ]


def _protocol(results: Any) -> dict[str, Any] | None:
    if not getattr(results, "protocol", ""):
        return None
    return {
        "name": results.protocol,
        "role": results.protocol_role,
        "trial": results.protocol_trial,
        "selected": bool(results.protocol_selected),
    }


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compact node list (``node[0-2,5],gpu7``) as node names, in order."""
    out: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]*)\]|([^,\[\]]+)", text):
        if plain:
            out.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                out.append(prefix + lo)
            else:  # zero-padded ranges keep their width (node[01-03])
                out += [f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1)]
    return out


def slurm_job(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The record's ``slurm`` field (None outside a Slurm job)."""
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID"):
        return None
    array, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    return {
        "job_id": f"{array}_{task}" if array and task else env["SLURM_JOB_ID"],
        "nodes": expand_nodelist(nodes),
        "node": env.get("SLURMD_NODENAME") or None,
        "restarts": int(env.get("SLURM_RESTART_COUNT") or 0),
    }


RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(RunRecord))


def settle(
    rec: RunRecord,
    results_dir: str | Path,
    curve: Sequence[Mapping[str, Any]],
    *,
    checkpoint: str | None,
    mllog: Callable[[], str | None],
) -> None:
    """The fields both ends of a run set last (``mllog()`` ends the MLPerf log)."""
    from bench.results import dawnbench  # here: the record's last step, not its schema
    from bench.results.events import events_path, read_events, restarts

    rec.restarts = restarts(read_events(events_path(results_dir, rec.run_id)))
    rec.checkpoint = checkpoint
    rec.mllog = mllog()
    rec.dawnbench_json, rec.dawnbench_tsv = dawnbench.write(results_dir, rec.to_dict(), curve)
