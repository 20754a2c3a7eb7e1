"""Run records: one JSON line per run in ``<dir>/runs.jsonl``, a curve CSV per run.

Writers never rewrite what is recorded: a record is appended under a file lock with an
fsync (several runs, or several sweeps, may finish at once), and a curve file is created
with a temporary file and an atomic rename, refusing to replace an existing one.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from filelock import FileLock

STATUSES = ("ok", "target_missed", "diverged", "error")

# The fields every record carries (more may follow).
RECORD_FIELDS = (
    "run_id", "started_at", "status", "experiment", "model", "data", "comm", "update", "cache",
    "loader", "world_size", "nnodes", "target_metric", "target_value", "best_value",
    "time_to_target_s", "epochs_to_target", "epochs_run", "train_time_s", "wall_time_s",
    "throughput_samples_per_s", "git_sha", "torch_version", "hardware", "config",
)


def new_run_id() -> str:
    return _dt.datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def now_iso() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def runs_path(results_dir: str | Path) -> Path:
    return Path(results_dir) / "runs.jsonl"


def curve_path(results_dir: str | Path, run_id: str) -> Path:
    return Path(results_dir) / "curves" / f"{run_id}.csv"


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def append_record(results_dir: str | Path, record: Mapping[str, Any]) -> Path:
    """Append one record as a JSON line (atomic with respect to other writers)."""
    missing = [f for f in ("run_id", "status") if f not in record]
    if missing:
        raise ValueError(f"record lacks {missing}")
    if record["status"] not in STATUSES:
        raise ValueError(f"status {record['status']!r} not in {STATUSES}")
    path = runs_path(results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, default=_json_default, allow_nan=False) + "\n"
    with FileLock(str(path) + ".lock"):
        # O_APPEND: the line lands after everything already there, never over it
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    return path


def write_curve(results_dir: str | Path, run_id: str, rows: Iterable[Mapping[str, Any]]) -> Path:
    path = curve_path(results_dir, run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pd.DataFrame(list(rows)).to_csv(tmp, index=False)
    try:
        os.link(tmp, path)  # fails if the curve exists: never replace a recorded curve
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_records(results_dir: str | Path) -> list[dict[str, Any]]:
    path = runs_path(results_dir)
    if not path.exists():
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out


def find_record(results_dir: str | Path, run_id: str) -> dict[str, Any] | None:
    for r in load_records(results_dir):
        if r.get("run_id") == run_id:
            return r
    return None


def records_frame(results_dir: str | Path) -> pd.DataFrame:
    """All records as one table, the config flattened to ``config.<group>.<key>`` columns."""
    recs = load_records(results_dir)
    if not recs:
        return pd.DataFrame(columns=list(RECORD_FIELDS))
    return pd.json_normalize(recs)


def load_curve(results_dir: str | Path, run_id: str) -> pd.DataFrame:
    return pd.read_csv(curve_path(results_dir, run_id))
