"""A node's elastic agent, ``python -m bench.cluster.agent <torchrun arguments>``: torchrun
that notes failed worker groups and dies with its launcher (docs/internals/launch.md); and
:func:`die_with_parent`, by which a worker does the same."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

from bench.cluster.torchrun import LAUNCHER_ENV, descendants, instrument_agent
from bench.results.events import AGENT_ERROR, EVENTS_ENV, log_event

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
DEATH_SIGNAL = signal.SIGUSR1  # torchrun handles TERM/INT/HUP/QUIT itself, gracefully


def kill_tree_and_exit(message: str, **print_kw: Any) -> None:
    """SIGKILL every descendant (twice: a child may fork meanwhile), print, exit."""
    for _ in range(2):
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    print(message, flush=True, **print_kw)
    os._exit(128 + signal.SIGKILL)


def die_with_launcher() -> None:
    text = os.environ.get(LAUNCHER_ENV, "")
    if not text.isdigit():
        return
    launcher = int(text)
    gone = f"agent: the launcher (pid {launcher}) is gone; workers killed"

    def on_death(signum: int, frame: FrameType | None) -> None:
        # the signal also comes when the launcher's thread that started us ends; only a
        # re-parented agent has lost its launcher
        if os.getppid() != launcher:
            kill_tree_and_exit(gone)

    signal.signal(DEATH_SIGNAL, on_death)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(DEATH_SIGNAL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != launcher:  # it died before the signal was armed
        kill_tree_and_exit(gone)


def die_with_parent(hint: str = "", poll_s: float = 0.2) -> None:
    """Once re-parented, kill this worker's children and exit without a record, so that a
    killed launcher leaves a resumable run."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        kill_tree_and_exit(
            f"worker {os.getpid()}: its launcher (pid {parent}) is gone; stopped without a "
            f"record{hint}",
            file=sys.stderr,
        )

    if parent > 1:  # not re-parented to init already
        threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def main() -> None:
    die_with_launcher()
    # deferred: torch takes seconds to load, and this module is read without it
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun

    instrument_agent()
    try:
        torchrun()
        # every worker has exited: skip the interpreter's teardown (a second of garbage
        # collection over torch's objects, while the launcher waits for this agent)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except Exception as e:
        if os.environ.get(EVENTS_ENV):
            msg = str(e).strip().splitlines()[0][:500] if str(e).strip() else ""
            if not msg and "Rendezvous" in type(e).__name__:
                msg = "not every node joined within cluster.rdzv_timeout_s"
            log_event(os.environ[EVENTS_ENV], kind=AGENT_ERROR, reason=f"{type(e).__name__}: {msg}")
        if isinstance(e, SignalException):  # its workers are stopped: nothing to trace
            print(f"agent: {e}; its workers were stopped", file=sys.stderr, flush=True)
            os._exit(128 + int(e.sigval))
        raise


if __name__ == "__main__":
    main()
