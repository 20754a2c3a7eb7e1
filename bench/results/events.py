"""A run's event log, ``<results.dir>/checkpoints/<run_id>/events.jsonl``: a JSON line per
failure, resume, error or stop outside the training loop (docs/internals/launch.md)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

EVENTS_ENV = "BENCH_EVENTS"  # where an elastic agent notes worker failures
QUEUE_KEY = "queue"  # the key of a queue JSON (several runs in one launch), not a run JSON

FAILURE = "failure"  # an agent's worker group failed: failed_rank, exit_code, restarts_left
RESUME = "resume"  # a worker group continued from a checkpoint: by (restart | hand), epoch
STOP = "stop"  # the launcher was interrupted: reason
WORKER_ERROR = "worker_error"  # the exception that ended a worker: rank, reason
AGENT_ERROR = "agent_error"  # the exception that ended an elastic agent: reason


def is_queue(payload: dict[str, Any]) -> bool:
    return QUEUE_KEY in payload


def run_dir(results_dir: str | Path, run_id: str) -> Path:
    return Path(results_dir) / "checkpoints" / run_id


def events_path(results_dir: str | Path, run_id: str) -> Path:
    return run_dir(results_dir, run_id) / "events.jsonl"


def events_env(run_json: Path) -> dict[str, str]:
    """``BENCH_EVENTS`` for the agents of ``run_json`` (a queue's: its own log)."""
    payload = json.loads(Path(run_json).read_text())
    if is_queue(payload):
        return {EVENTS_ENV: payload[QUEUE_KEY]["events"]}
    path = events_path(payload["config"]["results"]["dir"], payload["run"]["run_id"])
    return {EVENTS_ENV: str(path.resolve())}


def log_event(path: str | Path, **fields: Any) -> None:
    """One ``write`` of a short line with O_APPEND: never torn."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"time": time.time(), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_events(path: str | Path) -> list[dict[str, Any]]:
    out = []
    for line in Path(path).read_text().splitlines() if Path(path).exists() else []:
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def note_error(results_dir: str | Path, run_id: str, e: BaseException) -> None:
    reason = f"{type(e).__name__}: {e}".strip().splitlines()[0][:500]
    where = events_path(results_dir, run_id)
    log_event(where, kind=WORKER_ERROR, rank=os.environ.get("RANK"), reason=reason)


def restarts(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each elastic restart's first failure and the epoch resumed from."""
    out: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None
    for e in events:
        kind = e.get("kind")
        if kind == FAILURE and e.get("restarts_left", 0) > 0 and pending is None:
            keep = ("time", "failed_rank", "exit_code")
            pending = {**{k: e.get(k) for k in keep}, "epoch_resumed_from": None}
        elif kind == RESUME and pending is not None:
            if e.get("by") == "restart":
                pending["epoch_resumed_from"] = e.get("epoch")
            out.append(pending)
            pending = None
    return out + ([pending] if pending is not None else [])


def lost_since(events: list[dict[str, Any]], saved_at: float) -> float:
    """Seconds from a checkpoint saved at ``saved_at`` to the last failure or stop after it."""
    lost = [
        e["time"] - saved_at
        for e in events
        if e.get("kind") in (FAILURE, STOP) and e["time"] > saved_at
    ]
    return max(lost, default=0.0)


NO_SPACE = f"[Errno {errno.ENOSPC}]"  # in an OSError's text


def failure_reason(events: list[dict[str, Any]], rc: int) -> str:
    """The worker that died first, then the first traceback."""
    parts = []
    fails = [e for e in events if e.get("kind") == FAILURE]
    if fails:
        code = fails[-1]["exit_code"]
        sig = f" ({signal.Signals(-code).name})" if isinstance(code, int) and code < 0 else ""
        parts.append(f"worker rank {fails[-1]['failed_rank']} exited with code {code}{sig}")
    errs = [e for e in events if e.get("kind") in (WORKER_ERROR, AGENT_ERROR)]
    # a full disk first: the other ranks' errors (a peer gone) are its consequences
    errs.sort(key=lambda e: NO_SPACE not in str(e.get("reason")))
    if errs:
        who = f"rank {errs[0]['rank']}" if "rank" in errs[0] else "elastic agent"
        parts.append(f"{who}: {errs[0]['reason']}")
    if errs and NO_SPACE in str(errs[0].get("reason")):
        parts.insert(0, "no space left on device")  # the cause first, as the user acts on it
    return "; ".join(parts) or f"the workers exited with status {rc}"
