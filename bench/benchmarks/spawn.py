"""Run a function on N local gloo workers posing as ``N / procs_per_node`` nodes.

Used by the tests and by ``bench comm``: each worker gets the environment torchrun would
give it on a real cluster (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``), so :func:`bench.comm.topology.detect` sees ``nnodes x procs_per_node``
exactly as under ``torchrun --nnodes``.  Collectives go over loopback TCP (127.0.0.1).
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    fn: Callable[..., Any],
    rank: int,
    world: int,
    ppn: int,
    port: int,
    threads: int,
    timeout_s: float,
    q: Any,
    args: tuple,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank % ppn),
        LOCAL_WORLD_SIZE=str(ppn),
        GROUP_RANK=str(rank // ppn),
        GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
    )

    torch.set_num_threads(threads)
    try:
        # a worker stuck in a collective gives up instead of hanging the parent (default 30 min)
        dist.init_process_group(
            "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=timeout_s)
        )
        out = fn(rank, world, *args)
        q.put((rank, True, out))
    except BaseException:  # report, do not hang the parent
        q.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_workers(
    fn: Callable[..., Any],
    world_size: int = 4,
    procs_per_node: int = 2,
    *args: Any,
    threads: int = 1,
    timeout_s: float = 300.0,
) -> list[Any]:
    """``[fn(rank, world_size, *args) for each rank]`` computed by spawned gloo workers
    (``fn`` importable); a worker's exception is re-raised as RuntimeError."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_entry,
            args=(fn, r, world_size, procs_per_node, port, threads, timeout_s, q, args),
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        while len(results) < world_size:
            try:
                rank, ok, out = q.get(timeout=timeout_s)
            except queue.Empty:
                raise RuntimeError(f"workers did not finish within {timeout_s:.0f} s") from None
            if not ok:  # the first report may be a consequence: collect the others briefly
                errors = [(rank, out)]
                try:
                    while len(errors) + len(results) < world_size:
                        r2, ok2, out2 = q.get(timeout=5)
                        if not ok2:
                            errors.append((r2, out2))
                except queue.Empty:
                    pass
                msg = "\n".join(f"worker {r} failed:\n{tb}" for r, tb in errors)
                raise RuntimeError(msg)
            results[rank] = out
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world_size)]
