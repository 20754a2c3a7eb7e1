"""A tiny distributed worker that checks a cluster: who is where, and does allreduce work.

Run by a launcher in place of ``bench.train`` (tests, smoke checks)::

    python -m tests.helpers.cluster_probe --out DIR [--fail-rank R] [--sleep S] [--mb MB]

Each rank writes ``DIR/rank<r>.json``: rank, world size, local rank, the emulated node,
the address gloo uses, the allreduce result, and the median time (ms) of a ``MB``
megabyte allreduce within the node and across all workers.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def _timed(fn: object, reps: int = 3) -> float:
    fn()  # type: ignore[operator]
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--fail-rank", type=int, default=-1)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--mb", type=float, default=0.0)
    a = ap.parse_args(argv)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    nproc = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if rank == a.fail_rank:
        print(f"rank {rank} fails on purpose", file=sys.stderr, flush=True)
        os._exit(1)
    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x)
    rec: dict[str, object] = {
        "rank": rank,
        "world": world,
        "local_rank": local,
        "node": os.environ.get("BENCH_EMULATED_NODE"),
        "ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
        "hostname": socket.gethostname(),
        "allreduce_sum": x.item(),
        "link_check": os.environ.get("BENCH_LINK_CHECK"),
    }
    if a.mb > 0:
        # contiguous ranks share a node (torchrun assigns them per node)
        groups = [dist.new_group(list(range(s, s + nproc))) for s in range(0, world, nproc)]
        mine = groups[rank // nproc]
        t = torch.ones(int(a.mb * 2**20 / 4))
        rec["intra_allreduce_ms"] = _timed(lambda: dist.all_reduce(t, group=mine))
        rec["world_allreduce_ms"] = _timed(lambda: dist.all_reduce(t))
        rec["allreduce_mb"] = a.mb
    if a.sleep:
        time.sleep(a.sleep)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, f"rank{rank}.json").write_text(json.dumps(rec))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
