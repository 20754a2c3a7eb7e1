"""A node's elastic agent, ``python -m bench.cluster.agent <torchrun arguments>``: torch's
``torchrun`` that notes failed worker groups in the run's event log and dies, with its
workers, with its launcher (docs/internals/launch.md)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from types import FrameType

from bench.cluster.torchrun import LAUNCHER_ENV, descendants, instrument_agent
from bench.results.events import AGENT_ERROR, EVENTS_ENV, log_event

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
DEATH_SIGNAL = signal.SIGUSR1  # torchrun handles TERM/INT/HUP/QUIT itself, gracefully


def kill_tree_and_exit(launcher: int) -> None:
    """SIGKILL every descendant (twice: a child may fork while the first pass runs), exit."""
    for _ in range(2):
        for pid in descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    print(f"agent: the launcher (pid {launcher}) is gone; workers killed", flush=True)
    os._exit(128 + signal.SIGKILL)


def die_with_launcher() -> None:
    """Arm the parent-death signal when ``BENCH_LAUNCHER_PID`` names the launcher."""
    text = os.environ.get(LAUNCHER_ENV, "")
    if not text.isdigit():
        return
    launcher = int(text)

    def on_death(signum: int, frame: FrameType | None) -> None:
        # the signal also comes when the launcher's thread that started us ends; only a
        # re-parented agent has lost its launcher
        if os.getppid() != launcher:
            kill_tree_and_exit(launcher)

    signal.signal(DEATH_SIGNAL, on_death)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(DEATH_SIGNAL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != launcher:  # it died before the signal was armed
        kill_tree_and_exit(launcher)


def main() -> None:
    """torchrun; an error of the agent itself (a rendezvous that timed out) is noted too,
    a signal that ended it (the launcher's watchdog, a user) in one line."""
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
            reason = f"{type(e).__name__}: {msg}"
            log_event(os.environ[EVENTS_ENV], kind=AGENT_ERROR, reason=reason)
        if isinstance(e, SignalException):  # its workers are stopped: nothing to trace
            print(f"agent: {e}; its workers were stopped", file=sys.stderr, flush=True)
            os._exit(128 + int(e.sigval))
        raise


if __name__ == "__main__":
    main()
