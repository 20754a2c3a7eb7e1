"""A worker dies with the process that started it: a daemon thread watches the parent pid
and, once the worker is re-parented, kills its children and exits without a record, so a
killed launcher leaves a resumable run (docs/internals/cluster.md)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

from bench.cluster.agent import descendants

POLL_S = 0.2  # how quickly a worker notices that its launcher is gone
EXIT_STATUS = 128 + signal.SIGKILL  # as if the launcher's death had killed it


def stop(parent: int, hint: str) -> None:
    """Kill this worker's descendants and exit at once, writing nothing else."""
    for _ in range(2):  # a child may fork while the first pass runs
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    print(
        f"worker {os.getpid()}: its launcher (pid {parent}) is gone; stopped without a "
        f"record{hint}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_STATUS)


def die_with_parent(hint: str = "", poll_s: float = POLL_S) -> threading.Thread | None:
    """Start the watch for this process's current parent; ``hint`` ends the line printed
    when it fires (how to resume the run).  None where the parent is init already."""
    parent = os.getppid()
    if parent <= 1:
        return None

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        stop(parent, hint)

    t = threading.Thread(target=watch, name="die-with-parent", daemon=True)
    t.start()
    return t
