"""Worker of the ``cluster`` benchmark: every rank aggregates DDP-sized buckets through each
hook; the slowest rank's time per step, each node's link bytes and micro-measurements for
the model go to ``--out`` (rank 0)."""

from __future__ import annotations

import argparse
import math
import os
import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from bench.benchmarks.buckets import FakeBucket
from bench.benchmarks.spawn import torchrun_json
from bench.benchmarks.timing import interleaved_times, median_s
from bench.cluster.netns import link_counters
from bench.cluster.perfmodel import buckets_for
from bench.comm import HOOKS, is_sparse, make_hook, mstopk


class Aggregator:
    """The gradient buckets of one rank and one DDP hook per comm (bench.comm.make_hook),
    called as DDP calls it: every bucket handed over, then all futures awaited."""

    def __init__(self, buckets: list[int], density: float, nodes: int, m: int, comms: list[str]):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.n, self.m = nodes, m
        self.node, self.local = divmod(self.rank, m)
        self.density = density
        # every rank creates every group, in the same order
        self.hooks = {c: make_hook(c, density=density) for c in comms}
        self.states = {c: h[0] for c, h in self.hooks.items()}
        self.buckets = [
            FakeBucket(i, [torch.Size([d])], i == len(buckets) - 1, seed=100 * self.rank + i)
            for i, d in enumerate(buckets)
        ]
        self.grads = [b._src for b in self.buckets]
        self.bufs = [b.buffer() for b in self.buckets]

    def fresh(self) -> None:
        """New gradients in the bucket buffers (untimed: hooks overwrite their input)."""
        for b in self.buckets:
            b.refill()

    def aggregate(self, comm: str) -> None:
        state, hook = self.hooks[comm]
        torch.futures.wait_all([hook(state, b) for b in self.buckets])


def _shift_s(t: torch.Tensor, out: torch.Tensor, dst: int, src: int, reps: int) -> float:
    """Median time (s, slowest rank) of sending ``t`` to ``dst`` while receiving from ``src``."""

    def shift() -> None:
        reqs = [dist.isend(t, dst), dist.irecv(out, src)]
        for r in reqs:
            r.wait()

    return median_s(shift, reps=reps, slowest_rank=True)


def _calibrate(agg: Aggregator, sizes_mb: list[float], reps: int) -> dict[str, list]:
    """Micro-measurements for perfmodel.calibrate (s), all ranks busy at once: no
    collective and no end-to-end case, so every aggregation case is held out."""
    keys = ("ring_shift", "intra_shift", "select", "scatter", "dense_pass", "reduce")
    cal: dict[str, list] = {k: [] for k in keys}
    r, w, m = agg.rank, agg.world, agg.m
    timed: dict[str, Any] = dict(reps=reps, slowest_rank=True)
    intra_next = agg.node * m + (agg.local + 1) % m
    intra_prev = agg.node * m + (agg.local - 1) % m
    for mb in sizes_mb:
        t = torch.ones(max(1, int(mb * 2**20 / 4)))
        out, nbytes = torch.empty_like(t), t.numel() * 4
        cal["ring_shift"].append((nbytes, _shift_s(t, out, (r + 1) % w, (r - 1) % w, reps)))
        if m > 1:
            cal["intra_shift"].append((nbytes, _shift_s(t, out, intra_next, intra_prev, reps)))
    # selection over what the comms select from -- a node's shard (hitopk) and a whole
    # bucket (flat) -- in every bucket's own memory, one synchronised call per bucket
    for parts in (m, 1):
        total_s, total_n = 0.0, 0
        for g in agg.grads:
            x = g[: math.ceil(g.numel() / parts)]
            k = max(1, math.ceil(agg.density * x.numel()))
            total_s += median_s(lambda x=x, k=k: mstopk(x, k), **timed)
            total_n += x.numel()
        cal["select"].append((total_n, total_s))
    # per sparse comm, its communicator's own selection stage (error feedback, selector, wire
    # values: Communicator.compress) on what it selects from, one synchronised call a bucket
    for comm, st in agg.states.items():
        if not is_sparse(comm):
            continue
        parts = m if HOOKS.get(comm).hierarchical else 1
        total_s, total_n = 0.0, 0
        for i, g in enumerate(agg.grads):
            src = g[: math.ceil(g.numel() / parts)]
            buf = torch.empty_like(src)
            compress = partial(st.comm.compress, buf, ("calibrate", i), st.density)
            total_s += median_s(compress, setup=partial(buf.copy_, src), **timed)
            total_n += src.numel()
        cal[f"select_{comm}"] = [(total_n, total_s)]
    x = agg.grads[0].clone()  # one whole bucket
    k = max(1, math.ceil(agg.density * x.numel()))
    pairs = w * k  # what a flat allgather brings back
    v, i = torch.randn(pairs), torch.randint(x.numel(), (pairs,))
    out = torch.zeros(x.numel())
    cal["scatter"].append((pairs, median_s(lambda: out.index_add_(0, i, v), **timed)))

    # the elementwise passes the communicators make: add (error feedback), zero, scale --
    # over all bucket buffers, as in a step; and the summation of a reduction (add_)
    def passes() -> None:
        for b, g in zip(agg.bufs, agg.grads, strict=True):
            b.add_(g)
            b.zero_()
            b.div_(4.0)

    cal["dense_pass"].append((3 * sum(g.numel() for g in agg.grads), median_s(passes, **timed)))

    def sums() -> None:
        for b, g in zip(agg.bufs, agg.grads, strict=True):
            b.add_(g)

    cal["reduce"].append((sum(g.numel() for g in agg.grads), median_s(sums, **timed)))
    return cal


def _node_counters(agg: Aggregator) -> list[tuple[int, int]]:
    """Each node's link counters (read by its local rank 0), on every rank."""
    mine = torch.tensor(link_counters() if agg.local == 0 else (0, 0), dtype=torch.int64)
    every = [torch.zeros(2, dtype=torch.int64) for _ in range(agg.world)]
    dist.all_gather(every, mine)
    return [tuple(int(v) for v in every[i * agg.m]) for i in range(agg.n)]


def _measure(a: argparse.Namespace) -> dict[str, Any]:
    """Every comm's aggregation times and link bytes, the calibration around them."""
    m = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = dist.get_world_size() // m
    buckets = list(buckets_for(a.numel, a.bucket_mb))
    comms = a.comms.split(",")
    agg = Aggregator(buckets, a.density, nodes, m, comms)
    res: dict[str, Any] = {"nodes": nodes, "procs_per_node": m, "numel": a.numel}
    res.update(buckets=buckets, density=a.density)
    # calibration before and after the measured cases: the machine's load drifts
    calib_mb = [float(x) for x in a.calib_mb.split(",") if x]
    cal = _calibrate(agg, calib_mb, a.reps) if calib_mb else {}
    timed: dict[str, Any] = dict(warmup=a.warmup, reps=a.reps, slowest_rank=True)
    timed["setup"] = {0: agg.fresh}
    steps = a.warmup + a.reps

    def wire(fn: Callable[[], object]) -> tuple[list[float], list[list[float]]]:
        """``fn``'s times and, per node, its link's (tx, rx) bytes per step, warm-up too."""
        before = _node_counters(agg)
        times = interleaved_times({0: fn}, **timed)[0]
        pairs = zip(before, _node_counters(agg))
        return times, [[(y[0] - x[0]) / steps, (y[1] - x[1]) / steps] for x, y in pairs]

    # the timing harness's own traffic per step (barrier, allreduce of the time), to subtract
    res["harness_wire_bytes"] = wire(lambda: None)[1]
    for comm in comms:
        st = agg.states[comm].stats
        st.pop()  # zero the sums
        times, wire_bytes = wire(lambda c=comm: agg.aggregate(c))
        tot = st.pop()  # per-step means (the hook counts steps at the last bucket)
        res[comm] = {
            "median_ms": statistics.median(times),
            "min_ms": min(times),
            "times_ms": times,
            # rank 0's own split (hook stats), per step, ms
            "select_ms": tot["time/select_s"] * 1e3,
            "comm_ms": tot["time/comm_s"] * 1e3,
            "wire_bytes": wire_bytes,  # per node: (tx, rx) bytes of its link per step
        }
    after = _calibrate(agg, calib_mb, a.reps) if calib_mb else {}
    res["calibration"] = {key: cal.get(key, []) + after.get(key, []) for key in {*cal, *after}}
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--numel", type=int, default=25_557_032)
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--comms", required=True, help="comma-separated comm hooks")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--calib-mb", default="0.0625,2,8", help="ring-shift sizes; '' skips")
    a = ap.parse_args(argv)
    return torchrun_json(a.out, lambda: _measure(a))


if __name__ == "__main__":
    raise SystemExit(main())
