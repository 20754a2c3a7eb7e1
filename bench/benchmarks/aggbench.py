"""Worker of the ``cluster`` benchmark: time gradient aggregation on an (emulated) cluster.

Run on every node by :func:`bench.cluster.emulated.run_nodes`; all ranks aggregate a
gradient of ``--numel`` float32 elements, split into DDP-sized buckets, through the
project's communicators (``bench.comm.make_hook``; the hook's own ``reduce`` per bucket):

* ``dense``: allreduce per bucket (gloo's ring), divided by the world size;
* ``mstopk``: flat top-k -- error feedback, MSTopK of the whole bucket, one allgather of
  (value, index) pairs among all workers, scatter-add;
* ``hitopk``: HiTopKComm (Shi et al., MLSys 2021; see ``docs/algorithms.md``) --
  intra-node reduce-scatter, error feedback and MSTopK on the 1/m shard, allgather among
  the workers of the same local rank across nodes, allgather inside the node, scatter-add.

The time of one step is the slowest rank's (an allreduce-max of the per-rank times);
``median_ms`` is the median over ``--reps`` steps after ``--warmup``; fresh gradients are
copied into the bucket buffers before each step, outside the timing.  The same run also
measures what :func:`bench.cluster.perfmodel.calibrate` needs: allreduces within a node
and among all workers at a few sizes, selection, scatter-add and one elementwise pass,
all ranks at once (so the CPU contention of the measured case is in the calibration too).
Rank 0 writes ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from bench.cluster.perfmodel import buckets_for


class Aggregator:
    """The gradient buckets of one rank and one DDP hook state per comm (bench.comm)."""

    def __init__(
        self,
        buckets: list[int],
        density: float,
        nodes: int,
        m: int,
        comms: list[str],
        selector: str = "mstopk",
    ) -> None:
        from bench.comm import make_hook

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.n, self.m = nodes, m
        self.node, self.local = divmod(self.rank, m)
        self.density = density
        # every rank creates every group, in the same order
        self.states = {c: make_hook(c, density=density, selector=selector)[0] for c in comms}
        intra = [dist.new_group(list(range(i * m, (i + 1) * m))) for i in range(nodes)]
        self.intra = intra[self.node]
        g = torch.Generator().manual_seed(self.rank)
        self.grads = [torch.randn(d, generator=g) for d in buckets]
        self.bufs = [torch.empty(d) for d in buckets]
        self.shard = [math.ceil(d / m) for d in buckets]

    def fresh(self) -> None:
        """New gradients in the bucket buffers (untimed: hooks overwrite their input)."""
        for b, gr in zip(self.bufs, self.grads, strict=True):
            b.copy_(gr)

    def aggregate(self, comm: str) -> None:
        st = self.states[comm]
        for i, b in enumerate(self.bufs):
            dense = b.numel() < st.min_numel
            c = st.dense if dense else st.comm
            c.reduce(b, (i, b.numel()), st.density, st.stats).wait()


# torch >= 2.10 calls it reduce_scatter_single (reduce_scatter_tensor is deprecated)
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _step_ms(
    fn: Callable[[], object], warmup: int, reps: int, prepare: Callable[[], None] | None = None
) -> list[float]:
    """Per step: the slowest rank's time (ms)."""
    out = []
    for r in range(warmup + reps):
        if prepare is not None:
            prepare()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([(time.perf_counter() - t0) * 1e3])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if r >= warmup:
            out.append(t.item())
    return out


def _calibrate(agg: Aggregator, sizes_mb: list[float], reps: int) -> dict[str, list]:
    """Primitive costs with all ranks busy at once (s), for perfmodel.calibrate."""
    from bench.comm import mstopk

    cal: dict[str, list] = {
        "intra_allreduce": [],
        "world_allreduce": [],
        "intra_reduce_scatter": [],
        "select": [],
        "scatter": [],
        "dense_pass": [],
    }
    for mb in sizes_mb:
        t = torch.ones(int(mb * 2**20 / 4 / agg.m) * agg.m)
        for key, grp in (("intra_allreduce", agg.intra), ("world_allreduce", None)):
            ms = statistics.median(
                _step_ms(lambda t=t, g=grp: dist.all_reduce(t, group=g), 1, reps)
            )
            cal[key].append((t.numel() * 4, ms / 1e3))
        if agg.m > 1 and mb >= 1:  # the bandwidth term: large sizes only
            out = torch.empty(t.numel() // agg.m)
            ms = statistics.median(
                _step_ms(lambda t=t, o=out: _REDUCE_SCATTER(o, t, group=agg.intra), 1, reps)
            )
            cal["intra_reduce_scatter"].append((t.numel() * 4, ms / 1e3))
    # selection over what the comms select from -- a node's shard (hitopk) and a whole
    # bucket (flat) -- in every bucket's own memory, one synchronised call per bucket as
    # in a step (each is followed by a collective that waits for the slowest rank)
    for parts in (agg.m, 1):
        total_ms, total_n = 0.0, 0
        for g in agg.grads:
            x = g[: math.ceil(g.numel() / parts)]
            k = max(1, math.ceil(agg.density * x.numel()))
            total_ms += statistics.median(_step_ms(lambda x=x, k=k: mstopk(x, k), 1, reps))
            total_n += x.numel()
        cal["select"].append((total_n, total_ms / 1e3))
    x = agg.grads[0].clone()  # one whole bucket
    k = max(1, math.ceil(agg.density * x.numel()))
    pairs = agg.world * k  # what a flat allgather brings back
    v, i = torch.randn(pairs), torch.randint(x.numel(), (pairs,))
    out = torch.zeros(x.numel())
    ms = statistics.median(_step_ms(lambda: out.index_add_(0, i, v), 1, reps))
    cal["scatter"].append((pairs, ms / 1e3))

    # the elementwise passes the communicators make: add (error feedback), zero, scale --
    # over all bucket buffers, as in a step
    def passes() -> None:
        for b, g in zip(agg.bufs, agg.grads, strict=True):
            b.add_(g)
            b.zero_()
            b.div_(4.0)

    ms = statistics.median(_step_ms(passes, 1, reps))
    cal["dense_pass"].append((3 * sum(g.numel() for g in agg.grads), ms / 1e3))
    return cal


def _merge(a: dict[str, list], b: dict[str, list]) -> dict[str, list]:
    return {key: a.get(key, []) + b.get(key, []) for key in {*a, *b}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--numel", type=int, default=25_557_032)
    ap.add_argument("--density", type=float, default=0.001)
    ap.add_argument("--comms", default="dense,mstopk,hitopk")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--calib-mb", default="0.0625,8,25")
    a = ap.parse_args(argv)
    dist.init_process_group("gloo")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    m = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    nodes = dist.get_world_size() // m
    buckets = list(buckets_for(a.numel, a.bucket_mb))
    comms = a.comms.split(",")
    agg = Aggregator(buckets, a.density, nodes, m, comms)
    res: dict[str, object] = {
        "nodes": nodes,
        "procs_per_node": m,
        "numel": a.numel,
        "buckets": buckets,
        "density": a.density,
    }
    # calibration before and after the measured cases: the machine's load drifts
    calib_mb = [float(x) for x in a.calib_mb.split(",")]
    cal = _calibrate(agg, calib_mb, a.reps)
    for comm in comms:
        st = agg.states[comm].stats
        st0 = (st.select_s, st.comm_s)
        times = _step_ms(lambda c=comm: agg.aggregate(c), a.warmup, a.reps, prepare=agg.fresh)
        steps = a.warmup + a.reps
        res[comm] = {
            "median_ms": statistics.median(times),
            "min_ms": min(times),
            "times_ms": times,
            # rank 0's own split (hook stats), per step, ms
            "select_ms": (st.select_s - st0[0]) / steps * 1e3,
            "comm_ms": (st.comm_s - st0[1]) / steps * 1e3,
        }
    res["calibration"] = _merge(cal, _calibrate(agg, calib_mb, a.reps))
    if dist.get_rank() == 0:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
