"""Distributed self-checks of the hooks, run on local gloo workers posing as 2 nodes x 2.

``python -m tests.helpers.comm_checks`` prints them; ``tests/test_comm_dist.py`` asserts on them.
Each check runs inside every worker (spawned by :func:`bench.benchmarks.spawn.run_workers`) and
returns plain numbers, so the test process compares without touching torch.distributed.

- ``density_one``: with density 1.0 every top-k hook (and randomk) must give DDP's dense
  allreduce gradients; fp16/bf16 within their rounding; PowerSGD runs.
- ``conservation``: error feedback keeps what is not sent: over several steps,
  sum(applied) + sum(residuals) == sum(gradients) over all workers, for the flat allgather
  and hitopk, with float32 and float16 values on the wire.
- ``feedback``: error feedback re-sends what it kept: with a constant gradient every
  coordinate reaches the averaged gradient within a few ``1/density`` steps and the sum of
  the applied gradients approaches the sum of the gradients (flat allgather and hitopk).
- ``topology``: hitopk from torchrun's environment equals hitopk with an explicit
  ``procs_per_node``; one node is refused with ConfigError.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from bench.comm.hooks import make_hook
from bench.comm.stats import CommStats
from bench.registry import ConfigError


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 96),
        torch.nn.ReLU(),
        torch.nn.Linear(96, 10),
    )  # 35,818 parameters


def _ddp_grads(rank: int, name: str | None, steps: int = 2, **opts: Any) -> list[torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_model(), bucket_cap_mb=0.04)  # ~10 K floats per bucket: several buckets
    if name is not None:
        state, hook = make_hook(name, **opts)
        model.register_comm_hook(state, hook)
    grads = []
    for step in range(steps):  # step 2 runs on DDP's rebuilt buckets
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
    return grads


def density_one(rank: int, world: int) -> dict[str, float]:
    """Max |hook grad - dense DDP grad| per hook name, at density 1.0."""
    ref = _ddp_grads(rank, None)
    out: dict[str, float] = {}
    for name in ("dense", "topk", "mstopk", "randomk", "hitopk", "fp16", "bf16", "powersgd"):
        got = _ddp_grads(rank, name, density=1.0, min_numel=0)
        out[name] = max(float((a - b).abs().max()) for a, b in zip(got, ref, strict=True))
    out["ref_scale"] = float(ref[-1].abs().max())
    # PowerSGD compresses from its 3rd step on (start_powerSGD_iter >= 2): it must stay finite
    got = _ddp_grads(rank, "powersgd", steps=4, powersgd_rank=2)
    out["powersgd_compressed_finite"] = float(all(bool(torch.isfinite(g).all()) for g in got))
    return out


def _placed(comm: Any, numel: int) -> torch.Tensor:
    """This worker's residuals at their bucket positions (float64): flat -> the whole
    bucket; hitopk -> this worker's shard of its node sum."""
    placed = torch.zeros(numel, dtype=torch.float64)
    for key, r in comm.memory.buffers.items():
        if isinstance(key, tuple) and key[-1] == "shard":
            m = comm.groups.topo.procs_per_node
            s = r.numel()
            lr = comm.groups.topo.local_rank
            lo, hi = lr * s, min(numel, (lr + 1) * s)
            placed[lo:hi] += r[: hi - lo].double()
            assert s == -(-numel // m)
        else:
            placed += r.double()
    return placed


def conservation(rank: int, world: int) -> dict[str, float]:
    """Relative error of sum(applied) + sum(residual) vs sum(gradients), per setting."""
    out: dict[str, float] = {}
    numel = 50_000
    for name in ("mstopk", "topk", "hitopk", "randomk"):
        for vdt in ("float32", "float16"):
            state, _ = make_hook(name, density=0.02, value_dtype=vdt, min_numel=0, seed=rank)
            comm = state.comm
            grad_sum = torch.zeros(numel, dtype=torch.float64)
            applied = torch.zeros(numel, dtype=torch.float64)
            for step in range(5):
                g = torch.randn(numel, generator=torch.Generator().manual_seed(97 * step + rank))
                g[: numel // 10] *= 20  # a heavy part that wins the selection early
                grad_sum += g.double()
                buf = g.clone()
                res = comm.reduce(buf, "bucket", state.density, CommStats()).wait()
                applied += res.double() * world  # the hook returns the mean
            placed = _placed(comm, numel)
            dist.all_reduce(grad_sum)
            dist.all_reduce(placed)
            # applied is already the all-worker sum (identical on every rank)
            err = (applied + placed - grad_sum).abs().max() / grad_sum.abs().max()
            out[f"{name}/{vdt}"] = float(err)
    return out


def feedback(rank: int, world: int, steps: int = 60) -> dict[str, float]:
    """Per hook: fraction of coordinates ever applied, and L1 error of the applied sum."""
    out: dict[str, float] = {}
    numel = 4000
    gen = torch.Generator().manual_seed(0)  # signs shared by all workers: no cancellation
    sign = torch.randint(0, 2, (numel,), generator=gen).float() * 2 - 1
    gen = torch.Generator().manual_seed(1 + rank)
    g = (1 + torch.randint(0, 64, (numel,), generator=gen).float() / 64) * sign
    for name in ("mstopk", "hitopk"):
        for ef in (True, False):
            state, _ = make_hook(name, density=0.05, min_numel=0, error_feedback=ef)
            applied = torch.zeros(numel, dtype=torch.float64)
            ever = torch.zeros(numel, dtype=torch.bool)
            for _ in range(steps):
                res = state.comm.reduce(g.clone(), "bucket", state.density, CommStats()).wait()
                applied += res.double() * world  # the hook returns the mean
                ever |= res != 0
            total = g.double() * steps
            dist.all_reduce(total)
            label = f"{name}/{'ef' if ef else 'no_ef'}"
            out[f"{label}/ever_sent"] = float(ever.double().mean())
            out[f"{label}/l1_error"] = float((applied - total).abs().sum() / total.abs().sum())
    return out


def topology(rank: int, world: int) -> dict[str, Any]:
    """hitopk via env == hitopk with explicit procs_per_node; one node is refused."""
    out: dict[str, Any] = {}
    g = torch.randn(40_000, generator=torch.Generator().manual_seed(rank))
    res = {}
    for label, ppn in (("env", 0), ("explicit", 2)):
        state, _ = make_hook("hitopk", density=0.01, procs_per_node=ppn, selector="topk")
        res[label] = state.comm.reduce(g.clone(), "b", state.density, state.stats).wait()
        out[f"{label}/inter_bytes"] = state.stats.inter_bytes
        out[f"{label}/bytes"] = state.stats.bytes
    out["env_vs_explicit"] = float((res["env"] - res["explicit"]).abs().max())
    dstate, _ = make_hook("dense")
    dstate.comm.reduce(g.clone(), "b", 1.0, dstate.stats).wait()
    out["dense/inter_bytes"] = dstate.stats.inter_bytes
    try:
        make_hook("hitopk", procs_per_node=world)
        out["single_node"] = "accepted"
    except ConfigError as e:
        out["single_node"] = str(e)
    return out


def run_all(rank: int, world: int) -> dict[str, Any]:
    return {
        "density_one": density_one(rank, world),
        "conservation": conservation(rank, world),
        "feedback": feedback(rank, world),
        "topology": topology(rank, world),
    }


if __name__ == "__main__":
    from bench.benchmarks.spawn import run_workers

    for r, res in enumerate(run_workers(run_all, 4, 2)):
        print(r, res)


def wire_range(rank: int, world: int) -> dict[str, float]:
    """float16 wire values of gradients beyond float16's range (float32 buckets) and at its
    edge on every worker at once (float16 buckets, whose 4-worker sum is past 65504):
    per setting, whether every result is finite, and the relative conservation error of
    sum(applied) + sum(residuals) vs sum(gradients)."""
    out: dict[str, float] = {}
    numel = 20_000
    for name in ("mstopk", "hitopk"):
        for dtype in (torch.float32, torch.float16):
            state, _ = make_hook(name, density=0.01, value_dtype="float16", min_numel=0)
            big = [1e6, -2e5, 7e4] if dtype == torch.float32 else [6e4, -6e4, 65504.0]
            grad_sum = torch.zeros(numel, dtype=torch.float64)
            applied = torch.zeros(numel, dtype=torch.float64)
            finite = True
            for step in range(3):
                g = 3 * torch.randn(numel, generator=torch.Generator().manual_seed(step + rank))
                g[: len(big)] = torch.tensor(big)
                g = g.to(dtype)
                res = state.comm.reduce(g.clone(), "b", state.density, CommStats()).wait()
                finite &= bool(torch.isfinite(res).all())
                applied += res.double() * world
                grad_sum += g.double()
            placed = _placed(state.comm, numel)
            dist.all_reduce(grad_sum)
            dist.all_reduce(placed)
            err = (applied + placed - grad_sum).abs() / (grad_sum.abs() + 1)
            label = f"{name}/{str(dtype).removeprefix('torch.')}"
            out[f"{label}/finite"] = float(finite)
            out[f"{label}/error"] = float(err.max())
    return out


DELAY_S = 1.0  # how late the other workers join on rank 0


class _Bucket:
    """The part of ``dist.GradBucket`` that the hooks use (2-D gradients for PowerSGD)."""

    def __init__(self, index: int, rows: int, cols: int, last: bool, seed: int) -> None:
        self._index, self._last, self._shape = index, last, (rows, cols)
        self._buf = torch.randn(rows * cols, generator=torch.Generator().manual_seed(seed))
        self._param = torch.empty(0)

    def buffer(self) -> torch.Tensor:
        return self._buf

    def set_buffer(self, t: torch.Tensor) -> None:
        self._buf = t

    def gradients(self) -> list[torch.Tensor]:
        return [self._buf.view(self._shape)]

    def parameters(self) -> list[torch.Tensor]:
        return [self._param]

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return self._last


def asynchronous(rank: int, world: int) -> dict[str, dict[str, float]]:
    """Per hook, 4 buckets handed over at once while the other ranks join ``DELAY_S``
    late on rank 0: seconds the 4 hook calls took, until all futures completed, and the
    popped per-step ``time/comm_s`` and ``time/select_s``."""
    import time

    out = {}
    for name in ("dense", "fp16", "mstopk", "hitopk", "powersgd"):
        state, hook = make_hook(name, density=0.01, min_numel=0)
        buckets = [_Bucket(i, 64, 500, i == 3, 10 * rank + i) for i in range(4)]
        dist.barrier()
        if rank != 0:
            time.sleep(DELAY_S)
        t0 = time.perf_counter()
        futs = [hook(state, b) for b in buckets]
        call_s = time.perf_counter() - t0
        results = torch.futures.wait_all(futs)
        wall_s = time.perf_counter() - t0
        st = state.stats.pop()
        finite = all(bool(torch.isfinite(r).all()) for r in results)
        out[name] = {
            "call_s": call_s,
            "wall_s": wall_s,
            "comm_s": st["time/comm_s"],
            "select_s": st["time/select_s"],
            "finite": float(finite),
        }
    return out


def run_async(rank: int, world: int) -> dict[str, Any]:
    return {"asynchronous": asynchronous(rank, world), "wire_range": wire_range(rank, world)}
