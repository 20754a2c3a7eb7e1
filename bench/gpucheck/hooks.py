"""Device check of every DDP hook on CUDA tensors (gpucheck step ``hooks``).

``python -m bench.gpucheck.hooks [--cpu] [--out FILE]``: every hook on NCCL with one process
and on four gloo processes sharing the GPU; ranks equal, equal to dense, no host syncs, no
race.  Needs only torch.  What each column checks: docs/internals/gpucheck.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bench.benchmarks.spawn import free_port, run_workers
from bench.benchmarks.timing import cuda_syncs
from bench.comm import communicators, futures, make_hook
from bench.comm.selection_core import host_syncs

HOOKS = ("dense", "fp16", "bf16", "powersgd", "topk", "mstopk", "hitopk")
STEPS = 3
SLEEP_CYCLES = 2_000_000  # ~1 ms at the H200's ~1.9 GHz: far longer than any kernel here
DENSE_TOL = {"fp16": 2e-3, "bf16": 1.6e-2}  # relative, the wire dtype's rounding; else 1e-5
RACE_TOL = 1e-5  # relative to the gradient's largest magnitude


def _model(device: torch.device, width: int) -> nn.Module:
    torch.manual_seed(0)  # the same weights on every rank (DDP broadcasts them anyway)
    return nn.Sequential(
        nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.Linear(width, 10)
    ).to(device)


@contextlib.contextmanager
def _race(device: torch.device, on: bool) -> Iterator[None]:
    """Delay the stream before every collective is issued and at the start of every
    future callback (``Future.then``), while the block runs."""
    if not on:
        yield
        return

    def pause() -> None:
        if device.type == "cuda":
            torch.cuda._sleep(SLEEP_CYCLES)  # on the current stream of the current device
        else:
            time.sleep(0.001)

    orig_then, orig_collective = torch.futures.Future.then, futures.collective

    def then(self: Any, callback: Any) -> Any:
        def slow(f: Any) -> Any:
            pause()
            return callback(f)

        return orig_then(self, slow)

    def collective(stats: Any, like: torch.Tensor, issue: Any, then: Any = None) -> Any:
        def slow_issue() -> Any:
            with torch.cuda.device(like.device) if like.is_cuda else contextlib.nullcontext():
                pause()
            return issue()

        return orig_collective(stats, like, slow_issue, then)

    torch.futures.Future.then = then  # type: ignore[method-assign]
    communicators.collective = collective
    try:
        yield
    finally:
        torch.futures.Future.then = orig_then  # type: ignore[method-assign]
        communicators.collective = orig_collective


def _run(
    name: str, device: torch.device, ppn: int, density: float, timing: bool, race: bool, width: int
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The reduced gradient after STEPS backward passes, and what was counted."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model(device, width)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=1)
    opts: dict[str, Any] = {"density": density, "min_numel": 0, "timing": timing}
    if ppn:
        opts["procs_per_node"] = ppn
    state, hook = make_hook(name, **opts)
    ddp.register_comm_hook(state, hook)
    if hasattr(state, "nan_check"):
        state.nan_check = True  # the reduced buckets' flags too, as train.nan_check=step
    syncs: list[str] = []
    counted, finite = 0, True
    rank = dist.get_rank()
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(128, 64, generator=gen).to(device)
        ddp.zero_grad(set_to_none=False)
        loss = ddp(x).square().mean()
        before = host_syncs()
        with _race(device, race), cuda_syncs(device.type == "cuda") as found:
            loss.backward()
        counted += host_syncs() - before
        syncs += found
        if hasattr(state, "take_finite"):  # the loop's one read per step
            flags = [ok for _, ok in state.take_finite()]
            finite = finite and (not flags or bool(torch.stack(flags).all()))
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).float()
    stats = state.stats.pop()
    inexact = state.comm.inexact_count() if hasattr(state, "comm") else 0
    return grad, {
        "syncs": len(syncs) + counted,
        "sync_sites": sorted(set(syncs))[:5],
        "finite": finite,
        "inexact": inexact,
        "select_s": stats.get("time/select_s", 0.0),
        "comm_s": stats.get("time/comm_s", 0.0),
    }


def _rank_diff(t: torch.Tensor) -> float:
    """Largest difference of ``t`` between this rank and rank 0 over the default group."""
    ref = t.clone()
    dist.broadcast(ref, 0)
    d = (t - ref).abs().max()
    dist.all_reduce(d, op=dist.ReduceOp.MAX)
    return float(d)


SPARSE = ("topk", "mstopk", "hitopk")


def cases(world: int, ppn: int, hooks: tuple[str, ...] = HOOKS) -> list[tuple]:
    """(hook, density, timing, race probe) of one layout; hitopk needs two nodes.  The
    top-k hooks run at density 1.0 (compared with the dense allreduce) and 0.01 (their
    selection kernels: syncs, race probe, timing off)."""
    out = []
    for h in hooks:
        if h == "hitopk" and world // max(ppn, 1) < 2:
            continue
        d = 0.01 if h in SPARSE else 1.0
        if h in SPARSE:
            out.append((h, 1.0, True, False))
        out += [(h, d, True, False), (h, d, True, True), (h, d, False, False)]
    return out


def check_layout(
    rank: int, world: int, device_name: str, ppn: int, width: int, hooks: tuple[str, ...]
) -> list[dict]:
    """Every case of one layout on this rank (call on every rank of the default group)."""
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ref, _ = _run("dense", device, ppn, 1.0, True, False, width)
    rows = []
    for name, density, timing, race in cases(world, ppn, hooks):
        t0 = time.perf_counter()
        grad, info = _run(name, device, ppn, density, timing, False, width)
        row = {"hook": name, "density": density, "timing": timing, "race": race, **info}
        row.update(world=world, ppn=ppn)
        if race:  # the same case, delayed: must give what the undelayed run gave
            slow, rinfo = _run(name, device, ppn, density, timing, True, width)
            scale = float(grad.abs().max()) or 1.0
            row["race_diff"] = float((slow - grad).abs().max()) / scale
            row["syncs"] += rinfo["syncs"]
        row["rank_diff"] = _rank_diff(grad)
        if name != "powersgd" and density == 1.0:
            row["dense_err"] = float((grad - ref).norm() / ref.norm())
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
    return rows


def verdict(row: dict) -> list[str]:
    """What is wrong with one case (empty: it passed)."""
    bad = []
    if row["rank_diff"] != 0.0:
        bad.append(f"ranks differ by {row['rank_diff']:.3g}")
    if row["syncs"]:
        bad.append(f"{row['syncs']} host syncs in the hooks {row['sync_sites']}")
    tol = DENSE_TOL.get(row["hook"], 1e-5)
    if row.get("dense_err", 0.0) > tol:
        bad.append(f"dense_err {row['dense_err']:.3g} > {tol:g}")
    if row.get("race_diff", 0.0) > RACE_TOL:
        bad.append(f"race probe changed the result by {row['race_diff']:.3g}")
    if not row["finite"] or row["inexact"]:
        bad.append("non-finite or inexact selection flagged")
    return bad


def _nccl_world1(device_name: str, width: int, hooks: tuple[str, ...]) -> list[dict]:

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    backend = "nccl" if device_name.startswith("cuda") else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1, timeout=datetime.timedelta(300))
    try:
        return check_layout(0, 1, device_name, 0, width, hooks)
    finally:
        dist.destroy_process_group()


LAYOUTS = ("1", "2x2", "4x1")  # NCCL world 1; 4 gloo workers as 2 nodes x 2, 4 nodes x 1


def run(
    cpu: bool = False,
    width: int = 0,
    layouts: tuple[str, ...] = LAYOUTS,
    hooks: tuple[str, ...] = HOOKS,
) -> dict[str, Any]:
    """Every case of ``layouts``; returns ``{"rows": [...], "failed": [...]}``."""

    device = "cpu" if cpu else "cuda:0"
    width = width or (64 if cpu else 1024)
    rows: list[dict] = []
    for lay in layouts:
        if lay == "1":
            rows += _nccl_world1(device, width, hooks)
            continue
        nodes, ppn = (int(v) for v in lay.split("x"))  # all the workers share the one GPU
        rows += run_workers(
            check_layout, nodes * ppn, ppn, device, ppn, width, hooks, timeout_s=400
        )[0]
    failed = []
    for r in rows:
        bad = verdict(r)
        layout = "nccl 1" if r["world"] == 1 else f"gloo {r['world'] // r['ppn']}x{r['ppn']}"
        mark = "ok  " if not bad else "FAIL"
        print(
            f"{mark} {layout:<8} {r['hook']:<9} d={r['density']:<4g} timing={int(r['timing'])}"
            f" race={int(r['race'])}"
            f" syncs={r['syncs']} rank_diff={r['rank_diff']:.2g}"
            f" dense_err={r.get('dense_err', float('nan')):.2g}"
            f" race_diff={r.get('race_diff', float('nan')):.2g}"
            f" comm_ms={1e3 * r['comm_s'] / STEPS:.2f} {'; '.join(bad)}",
            flush=True,
        )
        if bad:
            failed.append({"layout": layout, "hook": r["hook"], "why": bad})
    return {"device": device, "rows": rows, "failed": failed}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpucheck.hooks", description=__doc__)
    ap.add_argument("--cpu", action="store_true", help="CPU tensors over gloo (plumbing only)")
    ap.add_argument("--out", default="", help="JSON file for every case")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="of: " + ",".join(LAYOUTS))
    ap.add_argument("--hooks", default=",".join(HOOKS), help="of: " + ",".join(HOOKS))
    args = ap.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("hooks: no CUDA device; --cpu checks the plumbing only")
        return 2
    layouts = tuple(v for v in args.layouts.split(",") if v)
    hooks = tuple(v for v in args.hooks.split(",") if v)
    unknown = [v for v in layouts if v not in LAYOUTS] + [v for v in hooks if v not in HOOKS]
    if unknown:
        print(f"hooks: unknown layouts or hooks: {', '.join(unknown)}", file=sys.stderr)
        return 2
    out = run(cpu=args.cpu, layouts=layouts, hooks=hooks)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)
    print(f"hooks: {len(out['rows'])} cases, {len(out['failed'])} failed")
    return 1 if out["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
