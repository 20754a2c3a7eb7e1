"""``cluster=emulated``: the link checked, then an elastic agent per node inside its
namespace (:mod:`bench.cluster.netns`), so that inter-node traffic crosses the shaped link;
and the bytes seen on those links while the workers train (docs/internals/cluster.md)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.cluster.config import ClusterConfig
from bench.cluster.linkcheck import run_link_check, write_link_check
from bench.cluster.netns import (
    EmulatedCluster,
    link_counters,
    parse_bandwidth,
    parse_latency,
    require_tools,
)
from bench.cluster.torchrun import (
    AGENT_MODULE,
    LAUNCHER_ENV,
    comm_timeout,
    stop_all,
    wait_all,
    worker_threads,
)
from bench.comm import cost
from bench.registry import ConfigError
from bench.results.events import EVENTS_ENV, events_env
from bench.results.timing import TrainClock

WORKER_MEM_GIB = 0.5  # resident memory of one CPU worker (torch + a small model), rough
MAX_WORKERS_PER_CORE = 4  # beyond this, CPU workers mostly wait for each other
NODE_ENV = "BENCH_EMULATED_NODE"  # set in every worker of an emulated node: its index


class RendezvousTimeoutError(ConfigError):
    """The nodes did not all join the rendezvous in time."""


def check_capacity(nnodes: int, nproc_per_node: int) -> None:
    """Refuse a cluster this machine cannot hold (workers per core, memory)."""
    if nnodes < 1 or nproc_per_node < 1:
        raise ConfigError(
            "cluster.nnodes and cluster.nproc_per_node must be >= 1, "
            f"got {nnodes} x {nproc_per_node}"
        )
    world = nnodes * nproc_per_node
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    if world > MAX_WORKERS_PER_CORE * cores:
        raise ConfigError(
            f"{nnodes} nodes x {nproc_per_node} workers = {world} workers is more than this "
            f"machine's {cores} cores can hold (at most {MAX_WORKERS_PER_CORE * cores})"
        )
    avail = available_memory()
    if avail is not None and world * WORKER_MEM_GIB > avail / 2**30:
        raise ConfigError(
            f"{world} workers need about {world * WORKER_MEM_GIB:.0f} GiB of memory, "
            f"only {avail / 2**30:.1f} GiB is available"
        )


def available_memory() -> float | None:
    """Bytes (``MemAvailable``; None: unknown)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("MemAvailable")) * 1024.0
    except (OSError, StopIteration, ValueError):
        return None


def ensure_port_free(host: str, port: int, argv_prefix: Sequence[str] = ()) -> None:
    """Refuse when ``host:port`` cannot be bound (in a namespace: ``argv_prefix``)."""
    if not 1 <= port <= 65535:
        raise ConfigError(f"port {port} is not a TCP port (1..65535)")
    code = f"import socket\nwith socket.socket() as s:\n s.bind(({host!r}, {port}))"
    argv = [*argv_prefix, sys.executable, "-c", code]
    if subprocess.run(argv, stderr=subprocess.DEVNULL).returncode:
        raise ConfigError(f"port {port} on {host} is already in use; choose another rdzv port")


class _Node:
    """One node's agent (own session); a thread copies its output to stdout as ``[n<i>] ...``."""

    def __init__(self, i: int, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.tail: deque[str] = deque(maxlen=200)
        self.pump = threading.Thread(target=self._copy, args=(i, sys.stdout), daemon=True)
        self.pump.start()

    def _copy(self, i: int, out: Any) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.tail.append(line.rstrip("\n"))
            out.write(f"[n{i}] {line}")
            out.flush()


def run_nodes(
    cluster: EmulatedCluster,
    nproc_per_node: int,
    module: str,
    args: list[str],
    *,
    rdzv_port: int = 29400,
    rdzv_timeout_s: int = 300,
    max_restarts: int = 0,
    threads_per_worker: int = 0,
    env: dict[str, str] | None = None,
    start_nodes: list[int] | None = None,
    timeout_s: float | None = None,
    stall_s: float = math.inf,
) -> int:
    """``python -m module *args`` on every node (``start_nodes``: some), under the watchdog
    over ``stall_s``; :class:`RendezvousTimeoutError` when the nodes do not all join,
    TimeoutError after ``timeout_s``."""
    n, env = cluster.nodes, env or {}
    ensure_port_free(cluster.addr(0), rdzv_port, cluster.exec_argv(0, []))
    threads = worker_threads(threads_per_worker, n * nproc_per_node)  # every node runs here
    nodes: list[_Node] = []
    try:
        for i in start_nodes if start_nodes is not None else range(n):
            argv = [
                sys.executable, "-m", AGENT_MODULE,
                # no --node-rank: the c10d rendezvous ranks the agents (contiguous per node)
                "--nnodes", str(n), "--nproc-per-node", str(nproc_per_node),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{cluster.addr(0)}:{rdzv_port}",
                "--rdzv-id", f"tkb-{cluster.run_id}",
                # node 0 hosts the c10d store: inside a namespace the hostname does not
                # resolve to the node's address, so say it explicitly
                "--rdzv-conf", f"join_timeout={rdzv_timeout_s},is_host={int(i == 0)}",
                "--local-addr", cluster.addr(i), "--max-restarts", str(max_restarts),
                "-m", module, *args,
            ]  # fmt: skip
            ifname = cluster.ifname(i)
            node_env = {
                **os.environ, **env,
                "GLOO_SOCKET_IFNAME": ifname, "NCCL_SOCKET_IFNAME": ifname,
                "TP_SOCKET_IFNAME": ifname, "OMP_NUM_THREADS": str(threads),
                "PYTHONUNBUFFERED": "1", NODE_ENV: str(i), LAUNCHER_ENV: str(os.getpid()),
            }  # fmt: skip
            nodes.append(_Node(i, cluster.exec_argv(i, argv), node_env))
    except BaseException:
        stop_all([x.proc for x in nodes])
        raise
    limit = math.inf if timeout_s is None else timeout_s
    rc = wait_all([x.proc for x in nodes], timeout_s=stall_s, events=env.get(EVENTS_ENV),
                  limit_s=limit)  # fmt: skip
    for x in nodes:
        x.pump.join(timeout=5)
    if any("RendezvousTimeoutError" in line for x in nodes for line in x.tail):
        raise RendezvousTimeoutError(
            f"the c10d rendezvous at {cluster.addr(0)}:{rdzv_port} did not complete "
            f"within {rdzv_timeout_s} s: not all {n} nodes joined"
        )
    return rc


def check_config(c: ClusterConfig) -> tuple[int, int, float, float]:
    """Nodes, workers, bandwidth (bit/s), latency (s), checked."""
    if c.nnodes < 2:
        raise ConfigError(f"cluster=emulated needs cluster.nnodes >= 2, got {c.nnodes}")
    check_capacity(c.nnodes, c.nproc_per_node)
    if not 0 < c.link_tolerance < 1:
        raise ConfigError(f"cluster.link_tolerance must be in (0, 1), got {c.link_tolerance}")
    bw, lat = parse_bandwidth(c.inter_node_bandwidth), parse_latency(c.inter_node_latency)
    return c.nnodes, c.nproc_per_node, bw, lat


def check_emulated(c: ClusterConfig) -> None:
    check_config(c)
    require_tools()


def launch_emulated(c: ClusterConfig, run_json: Path) -> int:
    nnodes, nproc, bw, lat = check_config(c)  # bad input is refused before anything is built
    require_tools()
    with EmulatedCluster(nnodes, bw, lat, subnet=c.subnet) as cluster:
        env: dict[str, str] = events_env(run_json)
        if c.link_check:
            result = run_link_check(cluster, c.link_tolerance, c.link_check_s)
            result["procs_per_node"] = nproc
            env["BENCH_LINK_CHECK"] = str(write_link_check(result, run_json))
            print(f"link check: {json.dumps(result)}", flush=True)
        return run_nodes(
            cluster,
            nproc,
            "bench.train",
            ["--config", str(run_json)],
            rdzv_port=c.rdzv_port,
            rdzv_timeout_s=c.rdzv_timeout_s,
            max_restarts=c.max_restarts,
            threads_per_worker=c.threads_per_worker,
            env=env,
            stall_s=comm_timeout(run_json),  # the local launcher's bound
        )


# --- bytes on the links, measured while the workers train --------------------------------
def wire_comparison(link_bytes: float, tx_per_node: Sequence[float]) -> dict[str, float]:
    """Bytes logged leaving a node with TCP/IP framing and ACKs beside the mean the nodes'
    counters saw leave (``tx_per_node``)."""
    pred = cost.on_wire(link_bytes, link_bytes)
    meas = sum(tx_per_node) / len(tx_per_node) if tx_per_node else float("nan")
    return {
        "link_bytes_per_node": link_bytes,
        "predicted_wire_bytes": pred,
        "wire_bytes_per_node": meas,
        "wire_error": meas / pred - 1 if pred else float("nan"),
    }


class LinkClock(TrainClock):
    """The training clock that, in an emulated node's first worker, also reads the link
    counters as it starts and pauses: the training steps' bytes alone."""

    def __init__(self, node: int | None = None) -> None:
        super().__init__()
        self.node = node  # None: this worker reads no counters (not a node's first)
        self.tx = self.rx = 0
        self.steps_from = 0  # the step this attempt started at (a resumed run's later)
        self._at: tuple[int, int] | None = None

    @classmethod
    def of_worker(cls, local_rank: int | None = None) -> LinkClock:
        node = os.environ.get(NODE_ENV)
        local = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
        return cls(int(node) if node is not None and node.isdigit() and local == 0 else None)

    def start(self) -> None:
        if self._since is None and self.node is not None:
            self._at = link_counters()
        super().start()

    resume = start

    def pause(self) -> float:
        if self._since is not None and self._at is not None:
            tx, rx = link_counters()
            self.tx, self.rx = self.tx + tx - self._at[0], self.rx + rx - self._at[1]
            self._at = None
        return super().pause()

    def reading(self) -> tuple[int, int, int] | None:
        return None if self.node is None else (self.node, self.tx, self.rx)


def link_bytes(
    readings: Sequence[tuple[int, int, int] | None], steps: int, logged: float | None
) -> dict[str, Any] | None:
    """The record's ``link_bytes`` (None: no node read or no step run)."""
    nodes = sorted(r for r in readings if r is not None)
    if not nodes or steps < 1:
        return None
    per_step = [[tx / steps, rx / steps] for _, tx, rx in nodes]
    out: dict[str, Any] = {
        "steps": steps,
        "nodes": [{"node": i, "tx_bytes": tx, "rx_bytes": rx} for i, tx, rx in nodes],
        "per_node_per_step": per_step,  # [tx, rx] per node
        "what": "each node's link counters over the training steps only (the clock "
        "running): frames whole, DDP's buffer broadcast and torchft's quorum and "
        "heartbeats included; evaluation, checkpoints and start-up excluded",
    }
    if logged is not None:
        cmp = wire_comparison(float(logged), [tx for tx, _ in per_step])
        out.update(cmp, ratio=cmp["wire_error"] + 1)
    return out
