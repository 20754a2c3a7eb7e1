"""The event log of a run: restarts paired with their resumes, the reason of a failed
launch, the agents' log of a run and of a queue of runs."""

from __future__ import annotations

import json
from pathlib import Path

from bench.results import events as ev


def test_restarts_pair_each_failure_with_the_epoch_resumed_from(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    ev.log_event(log, kind="failure", failed_rank=3, exit_code=-9, restarts_left=1, node=1)
    ev.log_event(log, kind="failure", failed_rank=0, exit_code=1, restarts_left=1, node=0)
    ev.log_event(log, kind="resume", by="restart", epoch=2)
    ev.log_event(log, kind="failure", failed_rank=0, exit_code=1, restarts_left=0)
    # one restart (both nodes' agents saw it; the first failure caused it); the last
    # failure ended the run: no restart
    (r,) = ev.restarts(ev.read_events(log))
    assert (r["failed_rank"], r["exit_code"], r["epoch_resumed_from"]) == (3, -9, 2)


def test_the_reason_names_the_first_failed_worker_and_the_first_traceback(tmp_path: Path) -> None:
    log = tmp_path / "events.jsonl"
    ev.log_event(log, kind=ev.FAILURE, failed_rank=1, exit_code=-9, restarts_left=0)
    ev.log_event(log, kind=ev.WORKER_ERROR, rank="1", reason="RuntimeError: boom")
    reason = ev.failure_reason(ev.read_events(log), 1)
    assert reason == "worker rank 1 exited with code -9 (SIGKILL); rank 1: RuntimeError: boom"
    assert ev.failure_reason([], 3) == "the workers exited with status 3"


def test_the_agents_log_is_the_runs_or_the_queues(tmp_path: Path) -> None:
    run = tmp_path / "run.json"
    run.write_text(
        json.dumps({"config": {"results": {"dir": str(tmp_path)}}, "run": {"run_id": "r1"}})
    )
    path = ev.events_env(run)[ev.EVENTS_ENV]
    assert path == str(ev.events_path(tmp_path, "r1").resolve())
    queue = tmp_path / "queue.json"
    queue.write_text(json.dumps({ev.QUEUE_KEY: {"id": "q", "runs": [], "events": "/x/q.jsonl"}}))
    assert ev.is_queue(json.loads(queue.read_text()))
    assert ev.events_env(queue) == {ev.EVENTS_ENV: "/x/q.jsonl"}


def test_the_work_lost_is_counted_from_the_checkpoint_to_the_last_failure() -> None:
    events = [
        {"time": 5.0, "kind": ev.FAILURE},  # before the checkpoint: not lost
        {"time": 12.0, "kind": ev.RESUME},
        {"time": 14.0, "kind": ev.STOP},
    ]
    assert ev.lost_since(events, 10.0) == 4.0
    assert ev.lost_since(events, 20.0) == 0.0
