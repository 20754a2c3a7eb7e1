"""A worker dies with the process that started it.

With one node the elastic agent runs inside the launcher, and torch starts each worker
in a session of its own: a SIGKILLed launcher (no handler can run) would leave the
workers training, and rank 0 would go on to append the run's final record, so that the
run could no longer be resumed.  :func:`die_with_parent` closes that gap in the worker
itself, whatever launched it: a daemon thread watches the parent pid, and once the
worker has been re-parented (its parent is gone) it SIGKILLs its own children
(data-loader processes) and exits without writing anything, leaving the last checkpoint
as the point to resume from.

A thread rather than ``prctl(PR_SET_PDEATHSIG)``: the kernel sends that signal when the
parent's *thread* that forked the worker ends, not only when the parent dies, and a
Python signal handler would wait for the main thread to leave a long collective call;
the polling thread runs while the main thread is inside torch (which releases the GIL).
"""

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


def _children(pid: int) -> list[int]:
    """Every process below ``pid``, from ``/proc`` (Linux; elsewhere none are found)."""
    return descendants(pid)


def stop(parent: int, hint: str) -> None:
    """Kill this worker's descendants and exit at once, writing nothing else."""
    for _ in range(2):  # a child may fork while the first pass runs
        for pid in _children(os.getpid()):
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
