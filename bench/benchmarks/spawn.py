"""Run a function on N local gloo workers posing as ``N / procs_per_node`` nodes, each with the
environment torchrun would give it (collectives over loopback TCP), or on the workers of a
torchrun launch (:func:`torchrun_json`)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import queue
import socket
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank: int, world: int, ppn: int, port: int, backend: str, timeout_s: float) -> None:
    """Join the default group as torchrun's worker ``rank`` of ``world``, ``ppn`` a node."""
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
    # a worker stuck in a collective gives up instead of hanging (default 30 min)
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)


@contextlib.contextmanager
def alone(device: str, timeout_s: float = 300.0) -> Iterator[None]:
    """A default group of this process alone: NCCL for a CUDA ``device``, else gloo."""
    _join(0, 1, 1, free_port(), "nccl" if device.startswith("cuda") else "gloo", timeout_s)
    try:
        yield
    finally:
        dist.destroy_process_group()


def torchrun_json(out: str, work: Callable[[], Any]) -> int:
    """``work()`` on this torchrun worker (gloo); rank 0 writes its result to JSON ``out``."""
    dist.init_process_group("gloo")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    res = work()
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(res, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _entry(fn: Callable[..., Any], rank: int, q: Any, args: tuple, setup: tuple) -> None:
    world, ppn, port, threads, timeout_s = setup
    torch.set_num_threads(threads)
    try:
        _join(rank, world, ppn, port, "gloo", timeout_s)
        q.put((rank, True, fn(rank, world, *args)))
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
    """``fn(rank, world_size, *args)`` on spawned gloo workers; a failure as RuntimeError."""
    ctx = mp.get_context("spawn")
    q, port = ctx.Queue(), free_port()
    setup = (world_size, procs_per_node, port, threads, timeout_s)
    procs = [ctx.Process(target=_entry, args=(fn, r, q, args, setup)) for r in range(world_size)]
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
                with contextlib.suppress(queue.Empty):
                    while len(errors) + len(results) < world_size:
                        r2, ok2, out2 = q.get(timeout=5)
                        if not ok2:
                            errors.append((r2, out2))
                raise RuntimeError("\n".join(f"worker {r} failed:\n{tb}" for r, tb in errors))
            results[rank] = out
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world_size)]
