"""Launching the workers of a run with torch.distributed's elastic launcher.

The launcher process (the Hydra app) validates the whole configuration, writes a run
JSON (config + run id + launch time) and hands it to a launcher from :data:`LAUNCHERS`:

- ``local``: this machine.  One node: ``torch.distributed.launcher.api.elastic_launch``
  (the engine behind ``torchrun``) in-process.  ``cluster.nnodes > 1``: one
  ``torchrun`` agent per node started here, joined by a c10d rendezvous on loopback, so
  that workers see GROUP_RANK / LOCAL_WORLD_SIZE exactly as on separate nodes.
- ``multinode``: this machine is node ``cluster.node_rank`` of a real cluster; run the same
  command on every node with the same ``cluster.rdzv_endpoint`` (host:port of node 0).
- ``emulated``: nodes in network namespaces with shaped links (:mod:`bench.cluster.emulated`).

Every worker runs ``python -m bench.train --config <run.json>``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.registry import ConfigError, Registry

LAUNCHERS: Registry[Callable[[Any, Path], int]] = Registry("cluster launcher")
WORKER_MODULE = "bench.train"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def worker_env(cfg: Any) -> dict[str, str]:
    env = dict(os.environ)
    if cfg.cluster.threads_per_worker:
        env["OMP_NUM_THREADS"] = str(cfg.cluster.threads_per_worker)
    else:
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // cfg.cluster.nproc_per_node)))
    return env


def torchrun_cmd(cfg: Any, run_json: Path, *, node_rank: int, endpoint: str, rdzv_id: str) -> list[str]:  # noqa: ARG001
    """A ``python -m torch.distributed.run`` command line for one node's agent.

    With the c10d rendezvous the agents are ranked by the rendezvous itself (GROUP_RANK),
    so ``node_rank`` only names the node in logs; it is not passed to torchrun.
    """
    c = cfg.cluster
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={c.nnodes}", f"--nproc-per-node={c.nproc_per_node}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf=join_timeout={c.rdzv_timeout_s}", f"--max-restarts={c.max_restarts}",
        "--monitor-interval=0.5",
        "-m", WORKER_MODULE, "--config", str(run_json),
    ]


@LAUNCHERS.register("local")
def launch_local(cfg: Any, run_json: Path) -> int:
    c = cfg.cluster
    if c.nnodes == 1:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

        lc = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=c.nproc_per_node,
            run_id=f"bench-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
            rdzv_endpoint=f"127.0.0.1:{free_port()}", rdzv_configs={"join_timeout": c.rdzv_timeout_s},
            max_restarts=c.max_restarts, monitor_interval=0.5, start_method="spawn",
        )
        os.environ.update({k: v for k, v in worker_env(cfg).items() if k == "OMP_NUM_THREADS"})
        try:
            elastic_launch(lc, sys.executable)("-u", "-m", WORKER_MODULE, "--config", str(run_json))
        except ChildFailedError as e:
            rank, failure = e.get_first_failure()
            print(f"error: worker rank {rank} failed with exit code {failure.exitcode} (its traceback is above)",
                  file=sys.stderr)
            return 1
        return 0
    # several "nodes" on this machine: one torchrun agent each, c10d rendezvous on loopback
    endpoint = f"127.0.0.1:{free_port()}"
    rdzv_id = f"bench-{uuid.uuid4().hex[:8]}"
    env = worker_env(cfg)
    procs = [
        subprocess.Popen(torchrun_cmd(cfg, run_json, node_rank=i, endpoint=endpoint, rdzv_id=rdzv_id), env=env)
        for i in range(c.nnodes)
    ]
    return _wait_all(procs)


def _wait_all(procs: list[subprocess.Popen]) -> int:
    rc = 0
    try:
        for p in procs:
            rc = rc or p.wait()
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    return rc


@LAUNCHERS.register("multinode")
def launch_multinode(cfg: Any, run_json: Path) -> int:
    c = cfg.cluster
    if not c.rdzv_endpoint:
        raise ConfigError("cluster=multinode needs cluster.rdzv_endpoint=<host of node 0>:<port>, the same on every node")
    rdzv_id = c.rdzv_id or "topk-bench"
    cmd = torchrun_cmd(cfg, run_json, node_rank=c.node_rank, endpoint=c.rdzv_endpoint, rdzv_id=rdzv_id)
    return _wait_all([subprocess.Popen(cmd, env=worker_env(cfg))])


def _load_plugins() -> None:
    """Launchers defined in their own modules register themselves on import."""
    import importlib

    for mod in ("bench.cluster.emulated",):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:
                raise


def validate(cfg: Any) -> None:
    _load_plugins()
    c = cfg.cluster
    LAUNCHERS.get(c.name)
    if c.nproc_per_node < 1:
        raise ConfigError(f"cluster.nproc_per_node must be >= 1, got {c.nproc_per_node}")
    if c.nnodes < 1:
        raise ConfigError(f"cluster.nnodes must be >= 1, got {c.nnodes}")
    if c.name == "multinode" and not 0 <= c.node_rank < c.nnodes:
        raise ConfigError(f"cluster.node_rank={c.node_rank} is outside 0..{c.nnodes - 1}")
    if c.backend not in ("auto", "gloo", "nccl"):
        raise ConfigError(f"cluster.backend={c.backend!r}; choose auto, gloo or nccl")
    if c.name == "emulated":
        from bench.cluster.emulated import check_config
        from bench.cluster.netns import require_tools

        check_config(c)
        require_tools()


def launch(cfg: Any, run_json: Path) -> int:
    _load_plugins()
    return LAUNCHERS.get(cfg.cluster.name)(cfg, run_json)
