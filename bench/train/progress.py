"""What rank 0 shows while a run trains: a bar over each epoch's steps on a terminal, and a
warning when other load on the machine makes its timings unreliable (``machine_load``)."""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

from tqdm import tqdm

BUSY_PER_CORE = 0.5  # runnable tasks per core beyond the run's own: its timings are unreliable
LOAD_TAU_S = 60.0  # time constant (s) of Linux's 1-minute load average, an exponential one
SIZE = (80, 24)  # columns, rows of a terminal that reports none (a pseudo-terminal of size 0)


def epoch_bar(s: Any) -> tqdm:
    """Rank 0's bar over the epoch's steps, on a terminal only; the load read at each start."""
    if s.rank == 0:
        _sample(s.run["run_id"], quick=True)
    show = s.rank == 0 and s.cfg.train.progress and sys.stderr.isatty()
    size = _size() if show else None
    return tqdm(
        total=s.steps,
        desc=f"epoch {s.epoch + 1}",
        unit="step",
        leave=False,
        dynamic_ncols=size is None,
        ncols=size and size[0],
        nrows=size and size[1],
        disable=not show,
        file=sys.stderr,
    )


def _size() -> tuple[int, int] | None:
    """None where the terminal reports its size, else :data:`SIZE` (tqdm draws nothing at 0)."""
    try:
        cols, rows = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError):
        return SIZE
    return None if cols and rows else SIZE


def show_step(bar: tqdm, loss: Any, samples: int, t0: float) -> None:
    """The bar's step; samples/s and loss (a device read) twice a second at most."""
    bar.update(1)
    if bar.disable or time.perf_counter() - getattr(bar, "_shown_at", 0.0) < 0.5:
        return
    bar._shown_at = time.perf_counter()
    rate = samples / max(1e-9, time.perf_counter() - t0)
    bar.set_postfix_str(f"loss {float(loss):.3f}, {rate:.0f} samples/s", refresh=False)


def others_running(samples: int = 20, gap_s: float = 0.005) -> float | None:
    """Runnable threads on this machine that are not this run's, averaged over ``samples``
    snapshots of /proc (None where there is none).  The run is this process, its children
    and every process of its torchrun job (``TORCHELASTIC_RUN_ID``); kernel threads are left
    out.  Unlike the 1-minute load average, this holds no tail of a run that just ended."""
    if not os.path.isdir("/proc/self/task"):
        return None
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    tag = f"TORCHELASTIC_RUN_ID={job}\0".encode() if job else None
    me, seen, total = os.getpid(), {}, 0
    for i in range(samples):
        for d in os.scandir("/proc"):
            if d.name.isdigit():
                total += _running_others(int(d.name), me, tag, seen)
        if i + 1 < samples:
            time.sleep(gap_s)
    return total / samples


def _running_others(pid: int, me: int, tag: bytes | None, seen: dict[int, bool]) -> int:
    """Runnable threads of process ``pid``, 0 where it is the run's own or a kernel thread."""
    try:
        running = 0
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/stat", "rb") as f:
                running += f.read().rsplit(b")", 1)[1].split()[0] == b"R"
        if not running:
            return 0
        if pid not in seen:
            with open(f"/proc/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            own = pid == me or ppid == me or pid == 2 or ppid == 2  # 2: the kernel's threads
            if not own and tag is not None:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    own = tag in f.read() + b"\0"
            seen[pid] = own
        return 0 if seen[pid] else running
    except (OSError, ValueError, IndexError):  # gone meanwhile, or not ours to read
        return 0


class MachineLoad:
    """Rank 0's machine's load beyond the run's own, per core: runnable threads that are not
    the run's (:func:`others_running`), or where /proc is missing the 1-minute load average
    less the run's workers (``n`` tasks started ``t`` s ago add ``n (1 - exp(-t / 60))``)."""

    def __init__(self, payload: dict[str, Any]) -> None:
        c = payload["config"]["cluster"]
        # every node of a local or emulated cluster runs on this machine
        here = c["nproc_per_node"] * (c["nnodes"] if c["name"] in ("local", "emulated") else 1)
        self.workers = int(here)
        launched = payload["run"].get("launch_time")
        self.launched = time.time() if launched is None else float(launched)
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        self.start: float | None = None
        self.worst = 0.0  # the most load per core beyond the run's own, over the samples
        self.warned = False

    def sample(self, quick: bool = False) -> None:
        """``quick``: one snapshot of /proc, not 20 (an epoch's start is inside its time)."""
        try:
            load = os.getloadavg()[0]
        except OSError:  # no load average on this system
            return
        others = others_running(1) if quick else others_running()
        if others is None:
            import torch  # the worker has it loaded; its threads are set by now (or the default)

            age = max(0.0, time.time() - self.launched)
            own = self.workers * torch.get_num_threads() * (1.0 - math.exp(-age / LOAD_TAU_S))
            others = max(0.0, load - own)
        self.start = load if self.start is None else self.start
        self.worst = max(self.worst, others / self.cores)
        if others / self.cores > BUSY_PER_CORE and not self.warned:
            self.warned = True
            print(
                f"warning: this machine is busy ({others:.1f} runnable tasks on {self.cores} "
                f"cores are not this run's; load average {load:.1f}): its timings are "
                "unreliable; compare them only with runs on an idle machine",
                file=sys.stderr,
                flush=True,
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "load_at_start": self.start,
            "max_others_per_core": round(self.worst, 2),
            "busy": self.worst > BUSY_PER_CORE,
        }


_LOADS: dict[str, MachineLoad] = {}  # run id -> its load, in rank 0's process


def watch_load(payload: dict[str, Any]) -> None:
    """Rank 0: the machine's load as the worker starts (a warning if busy)."""
    if os.environ.get("RANK", "0") == "0":
        load = _LOADS[payload["run"]["run_id"]] = MachineLoad(payload)
        load.sample()


def _sample(run_id: str, quick: bool = False) -> None:
    if run_id in _LOADS:
        _LOADS[run_id].sample(quick)


def machine_load(run_id: str) -> dict[str, Any] | None:
    """The run's load, read once more now, for its record (None where it was not read)."""
    load = _LOADS.pop(run_id, None)
    if load is None:
        return None
    load.sample()
    return load.to_dict()
