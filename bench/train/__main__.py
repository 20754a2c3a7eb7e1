"""``python -m bench.train --config <json>``: one worker of a run or a queue of runs."""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from bench.cluster.agent import die_with_parent
from bench.config import from_container
from bench.data.jpegs import CorruptImage
from bench.results import records
from bench.results.events import QUEUE_KEY, is_queue, note_error
from bench.train import runtime
from bench.train.loop import train


def worker_loop(payload: dict[str, Any]) -> None:
    paths = payload[QUEUE_KEY]["runs"]
    runs = [json.loads(Path(p).read_text()) for p in paths]
    rank, _, _ = runtime.setup_distributed(from_container(runs[0]["config"]))  # one group
    # the runs recorded before an elastic restart restarted this queue: rank 0 reads them
    dirs = {r["config"]["results"]["dir"] for r in runs}
    mine = {r["run_id"] for d in dirs for r in records.load_records(d)} if rank == 0 else None
    done = runtime.broadcast_object(mine)
    first = True
    for i, run in enumerate(runs):
        if run["run"]["run_id"] in done:
            continue
        if not first:  # the run starts now, not when the queue was launched
            run["run"]["launch_time"] = time.time()
            run["run"]["started_at"] = records.now_iso()
        first = False
        if rank == 0:
            label = run["run"].get("queue", {}).get("label", "")
            qid = payload[QUEUE_KEY]["id"]
            print(f"queue {qid}: run {i + 1} of {len(paths)} {label}", flush=True)
        try:
            train(run, leave_group=False)
        except BaseException as e:
            note_error(run["config"]["results"]["dir"], run["run"]["run_id"], e)
            raise
        gc.collect()  # the finished run's model, loaders and buffers, before the next one
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


PEER_GONE = "Connection closed by peer"  # gloo, when another worker has exited


def _resume_hint(payload: dict[str, Any]) -> str:
    run, cfg = payload.get("run"), payload.get("config")
    if not run or not cfg:  # a queue: each of its runs says how when it is resumed
        return ""
    where = shlex.quote(f"results.dir={cfg['results']['dir']}")  # pasted into a shell
    return (
        f"; continue from its last checkpoint with: python -m reproduce train "
        f"resume={run['run_id']} {where}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one data-parallel training worker")
    ap.add_argument("--config", required=True, help="run (or run queue) JSON from the launcher")
    payload = json.loads(Path(ap.parse_args(argv).config).read_text())
    die_with_parent(_resume_hint(payload))  # a SIGKILLed launcher must not leave us training
    try:
        if is_queue(payload):
            worker_loop(payload)  # notes the failing run's error itself
            return 0
        try:
            train(payload)
        except BaseException as e:  # noted for the launcher's error record, then re-raised
            # on a full disk the note may not fit either: the error itself is the news
            with contextlib.suppress(OSError) if _no_space(e) else contextlib.nullcontext():
                note_error(payload["config"]["results"]["dir"], payload["run"]["run_id"], e)
            raise
    except BaseException as e:
        msg = _one_line(e)
        if msg is None:
            raise
        print(f"error: rank {os.environ.get('RANK', '0')}: {msg}", file=sys.stderr, flush=True)
        return 1
    return 0


def _no_space(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno == errno.ENOSPC


def _one_line(e: BaseException) -> str | None:
    """What ends this worker in one line (a full disk, a damaged image, a peer gone), or None."""
    if _no_space(e):
        return f"no space left on device ({e.filename or e.strerror})"  # type: ignore[attr-defined]
    if isinstance(e, CorruptImage):
        return str(e)
    if isinstance(e, RuntimeError) and PEER_GONE in str(e):
        return PEER_GONE
    return None


if __name__ == "__main__":
    code = main()
    # done and written: skip the interpreter's teardown (seconds of garbage collection
    # over torch's objects in every worker, while the launcher waits)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
