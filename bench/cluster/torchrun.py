"""The ``local`` and ``multinode`` launchers (torch's elastic agents on real hosts), and the
watchdog over the agents of every launcher (docs/internals/launch.md)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench.cluster.config import ClusterConfig
from bench.cluster.netns import proc_stat
from bench.registry import ConfigError
from bench.results.events import EVENTS_ENV, FAILURE, QUEUE_KEY, events_env, is_queue, log_event

WORKER_MODULE = "bench.train"
AGENT_MODULE = "bench.cluster.agent"  # torchrun, noting failed worker groups
GENERATION_ENV = "BENCH_GENERATION"  # one token per rendezvous round, the same on every node
LAUNCHER_ENV = "BENCH_LAUNCHER_PID"  # an agent dies with this process (bench.cluster.agent)
MARGIN_S = 15.0  # a stopped run ends within comm.timeout_s plus this (docs/troubleshooting.md)
GRACE_S = 10.0  # from SIGTERM to SIGKILL of what is left of a run
STOPPED = "stopped"  # event: a process of the run stopped responding (who, reason)


def instrument_agent() -> None:
    """Patch torch's local elastic agent in place: failed worker groups noted in
    ``$BENCH_EVENTS``, each rendezvous round's workers given one ``$BENCH_GENERATION``."""
    # deferred: torch takes seconds to load, and this module is read without it
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent as A

    monitor_workers, start_workers = A._monitor_workers, A._start_workers
    if getattr(monitor_workers, "_bench", False):
        return

    def monitor(self: Any, worker_group: Any) -> Any:
        result = monitor_workers(self, worker_group)
        path = os.environ.get(EVENTS_ENV)
        if path and result.state == WorkerState.FAILED and result.failures:
            rank, failure = min(result.failures.items(), key=lambda kv: kv[1].timestamp)
            spec = worker_group.spec
            log_event(
                path, kind=FAILURE, failed_rank=rank, exit_code=failure.exitcode,
                restart=spec.max_restarts - self._remaining_restarts + 1,
                restarts_left=self._remaining_restarts, node=worker_group.group_rank,
            )  # fmt: skip
        return result

    def start(self: Any, worker_group: Any) -> Any:
        token = uuid.uuid4().hex[:12]
        # the round's store (c10d rendezvous: prefixed by the round); the first agent wins
        shared = worker_group.store.compare_set("bench_generation", "", token)
        os.environ[GENERATION_ENV] = shared.decode() if isinstance(shared, bytes) else shared
        return start_workers(self, worker_group)

    monitor._bench = True  # type: ignore[attr-defined]
    A._monitor_workers, A._start_workers = monitor, start  # type: ignore[method-assign]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def worker_threads(threads_per_worker: int, workers: int) -> int:
    """``threads_per_worker``, else ``$OMP_NUM_THREADS``, else the cores over ``workers``."""
    env = os.environ.get("OMP_NUM_THREADS", "")
    if threads_per_worker or (env.isdigit() and int(env) > 0):
        return threads_per_worker or int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // workers)


def worker_env(c: ClusterConfig) -> dict[str, str]:
    here = c.nproc_per_node * (c.nnodes if c.name == "local" else 1)
    threads = worker_threads(c.threads_per_worker, here)
    return {**os.environ, LAUNCHER_ENV: str(os.getpid()), "OMP_NUM_THREADS": str(threads)}


def torchrun_cmd(
    c: ClusterConfig,
    run_json: Path,
    *,
    endpoint: str,
    rdzv_id: str,
    is_host: bool | None = None,
    local_addr: str = "",
) -> list[str]:
    """One node's agent command.  ``is_host`` (None: torch's guess) and ``local_addr`` ("":
    the host name's) matter where nodes share one host name."""
    host = "" if is_host is None else f",is_host={int(is_host)}"
    return [
        sys.executable, "-m", AGENT_MODULE,
        f"--nnodes={c.nnodes}", f"--nproc-per-node={c.nproc_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf=join_timeout={c.rdzv_timeout_s}{host}", f"--max-restarts={c.max_restarts}",
        *([f"--local-addr={local_addr}"] if local_addr else []),
        "--monitor-interval=0.5",
        "-m", WORKER_MODULE, "--config", str(run_json),
    ]  # fmt: skip


def launch_local(c: ClusterConfig, run_json: Path) -> int:
    if c.nnodes > 1:
        env = {**worker_env(c), **events_env(run_json)}
        endpoint, rdzv_id = f"127.0.0.1:{free_port()}", f"bench-{uuid.uuid4().hex[:8]}"
        cmd = torchrun_cmd(c, run_json, endpoint=endpoint, rdzv_id=rdzv_id)
        agents = [subprocess.Popen(cmd, env=env, start_new_session=True) for _ in range(c.nnodes)]
        return wait_all(agents, timeout_s=comm_timeout(run_json), events=env[EVENTS_ENV])
    # deferred: torch takes seconds to load, and this module is read without it
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    lc = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=c.nproc_per_node,
        run_id=f"bench-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
        rdzv_configs={"join_timeout": c.rdzv_timeout_s},
        max_restarts=c.max_restarts, monitor_interval=0.5, start_method="spawn",
    )  # fmt: skip
    os.environ["OMP_NUM_THREADS"] = worker_env(c)["OMP_NUM_THREADS"]
    os.environ.update(events_env(run_json))
    instrument_agent()
    try:
        elastic_launch(lc, sys.executable)("-u", "-m", WORKER_MODULE, "--config", str(run_json))
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        print(
            f"error: worker rank {rank} failed with exit code {failure.exitcode} "
            "(its error is above)",
            file=sys.stderr,
        )
        return 1
    return 0


def comm_timeout(run_json: Path) -> float:
    """The longest ``comm.timeout_s`` of the run (or queue) of ``run_json``."""
    payload = json.loads(Path(run_json).read_text())
    paths = payload[QUEUE_KEY]["runs"] if is_queue(payload) else []
    configs = [json.loads(Path(p).read_text())["config"] for p in paths] or [payload["config"]]
    return max(float(cfg["comm"]["timeout_s"]) for cfg in configs)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from ``/proc``."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        fields = proc_stat(p.name) if p.name.isdigit() else None
        if fields:
            children.setdefault(int(fields[1]), []).append(int(p.name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(kids)
    return out


def _state(pid: int) -> str:
    fields = proc_stat(pid)
    return fields[0] if fields else ""  # T: stopped


def _who(pid: int, agent: int, agent_pid: int) -> str:
    """``agent 0 (pid 12)`` or ``worker rank 1 (pid 34) under agent 0``."""
    if pid == agent_pid:
        return f"agent {agent} (pid {pid})"
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        rank = next((e[5:].decode() for e in env if e.startswith(b"RANK=")), "?")
    except OSError:
        rank = "?"
    return f"worker rank {rank} (pid {pid}) under agent {agent}"


def _tree(procs: list[subprocess.Popen]) -> dict[int, tuple[int, int]]:
    out = {}
    for i, p in enumerate(procs):
        if p.poll() is None:
            out.update({pid: (i, p.pid) for pid in [p.pid, *descendants(p.pid)]})
    return out


def wait_all(
    procs: list[subprocess.Popen],
    *,
    timeout_s: float = math.inf,
    events: str | None = None,
    poll_s: float = 0.5,
    limit_s: float = math.inf,
) -> int:
    """Wait on every agent: the first non-zero exit status ends the run (0 if none), as does
    a process stopped for ``timeout_s`` or an agent left ``timeout_s`` after the others ended
    well (named in ``events``, else on stderr); TimeoutError after ``limit_s``.  What is left
    is stopped, also when the wait is interrupted."""
    rc, stopped_since, since_ok, start = 0, {}, None, time.monotonic()
    note: list[str] = []
    try:
        while True:
            codes = [p.poll() for p in procs]
            rc = next((c for c in codes if c), 0)
            tree = _tree(procs)
            stopped = [pid for pid in tree if _state(pid) in ("T", "t")]
            if rc or all(c is not None for c in codes):
                note = [f"{_who(pid, *tree[pid])} was stopped" for pid in stopped]
                break
            now = time.monotonic()
            stopped_since = {pid: stopped_since.get(pid, now) for pid in stopped}
            late = [pid for pid, t in stopped_since.items() if now - t >= timeout_s]
            if any(c == 0 for c in codes):
                since_ok = since_ok or now
            if now - start >= limit_s:
                raise TimeoutError(f"the run did not finish within {limit_s:.0f} s")
            if late or (since_ok and now - since_ok >= timeout_s):
                rc = 1
                note = [
                    f"{_who(pid, *tree[pid])} stopped responding (stopped for {timeout_s:g} s, "
                    "comm.timeout_s)"
                    for pid in late
                ] or [
                    f"agent {i} (pid {p.pid}) did not end within {timeout_s:g} s "
                    "(comm.timeout_s) of the others"
                    for i, p in enumerate(procs)
                    if p.poll() is None
                ]
                break
            time.sleep(poll_s)
    finally:
        stop_all(procs)
    for line in note:
        if events:
            log_event(events, kind=STOPPED, reason=f"{line}; the run was ended")
        else:
            print(f"error: {line}; the run was ended", file=sys.stderr, flush=True)
    return rc


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each agent left (it stops its workers), SIGCONT the stopped; after
    :data:`GRACE_S`, SIGKILL every process group of the run still there."""
    tree = _tree(procs)
    groups = set()
    for pid in tree:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(pid))
    groups.discard(os.getpgid(0))  # never our own
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(OSError):
                p.terminate()
    for pid in tree:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGCONT)

    def wait_gone() -> None:
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and any(_state(pid) not in ("", "Z") for pid in tree):
            for p in procs:
                p.poll()  # reaps an agent that ended
            time.sleep(0.1)

    wait_gone()
    for g in groups:
        with contextlib.suppress(OSError):
            os.killpg(g, signal.SIGKILL)
    wait_gone()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=GRACE_S)


def check_multinode(c: ClusterConfig) -> None:
    if not 0 <= c.node_rank < c.nnodes:
        raise ConfigError(f"cluster.node_rank={c.node_rank} is outside 0..{c.nnodes - 1}")
    if not c.rdzv_endpoint:
        raise ConfigError(
            "cluster=multinode needs cluster.rdzv_endpoint=<host of node 0>:<port>, "
            "the same on every node"
        )


def launch_multinode(c: ClusterConfig, run_json: Path) -> int:
    """This machine's agent; node 0 hosts the store (the endpoint need not resolve to it)."""
    check_multinode(c)
    rdzv_id = c.rdzv_id or "topk-bench"
    cmd = torchrun_cmd(c, run_json, endpoint=c.rdzv_endpoint, rdzv_id=rdzv_id,
                       is_host=c.node_rank == 0, local_addr=c.local_addr)  # fmt: skip
    env = {**worker_env(c), **events_env(run_json)}
    agent = subprocess.Popen(cmd, env=env, start_new_session=True)
    return wait_all([agent], timeout_s=comm_timeout(run_json), events=env[EVENTS_ENV])
