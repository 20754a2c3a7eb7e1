"""gpucheck step ``hooks``, torch only: every DDP hook on CUDA tensors, NCCL with one process
and gloo processes sharing the GPU: ranks equal, equal to dense, no host syncs in this
project's code, no race (docs/internals/gpucheck.md)."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn

from bench import methods
from bench.benchmarks.spawn import alone, run_workers
from bench.benchmarks.timing import cuda_syncs
from bench.comm import communicators, futures, make_hook
from bench.comm.compressors import COMPRESSORS
from bench.comm.selection_core import host_syncs
from bench.gpucheck.rows import Rows, read

# every method that is a per-step comm hook (the measurement device nocomm aside)
HOOKS = tuple(methods.names(kind="hook"))
STEPS = 3
SLEEP_CYCLES = 2_000_000  # ~1 ms at the H200's ~1.9 GHz: far longer than any kernel here
# Relative to the gradient's largest magnitude.  Ranks agree bit for bit (every reduction
# here is deterministic), but two runs may pick other elements at exact magnitude ties
# (Triton's compaction fills its slots in no fixed order): a rounding-size limit.
RACE_TOL = 1e-5

_BENCH = Path(__file__).resolve().parents[1]  # this project's library
_HARNESS = (_BENCH / "gpucheck", _BENCH / "benchmarks")  # the check itself, not judged
_TORCH_HOOKS = os.path.join("torch", "distributed", "algorithms")  # torch's own DDP hooks


def sync_site(stack: list[traceback.FrameSummary]) -> str:
    """Who made a synchronising call: ``bench|torch|other <file:line>``, the innermost frame
    of this library (the check's own aside) or of torch's DDP hooks (PowerSGD's)."""
    for fr in reversed(stack):
        path = Path(fr.filename)
        if _TORCH_HOOKS in fr.filename:
            return f"torch {path.name}:{fr.lineno}"
        if path.is_relative_to(_BENCH) and not any(path.is_relative_to(h) for h in _HARNESS):
            return f"bench {path.relative_to(_BENCH.parent)}:{fr.lineno}"
    last = stack[-1] if stack else None
    return f"other {Path(last.filename).name}:{last.lineno}" if last else "other ?"


@contextlib.contextmanager
def race(device: torch.device, on: bool, counter: list[int]) -> Iterator[None]:
    """Delay the stream before each collective is issued and at the start of each ``then`` and
    ``add_done_callback`` callback of ``torch._C.Future`` (Python's extends it); ``counter[0]``
    counts the delays."""
    if not on:
        yield
        return

    def pause() -> None:
        counter[0] += 1
        if device.type == "cuda":
            torch.cuda._sleep(SLEEP_CYCLES)  # on the current stream of the current device
        else:
            time.sleep(0.001)

    def slowed(callback: Any) -> Any:
        def slow(f: Any) -> Any:
            pause()
            return callback(f)

        return slow

    cls, issue_ = torch._C.Future, futures.collective
    then, done = cls.then, cls.add_done_callback

    def collective(stats: Any, like: torch.Tensor, issue: Any, then: Any = None) -> Any:
        def slow_issue() -> Any:
            with torch.cuda.device(like.device) if like.is_cuda else contextlib.nullcontext():
                pause()
            return issue()

        return issue_(stats, like, slow_issue, then)

    with (
        mock.patch.object(cls, "then", lambda self, cb: then(self, slowed(cb))),
        mock.patch.object(cls, "add_done_callback", lambda self, cb: done(self, slowed(cb))),
        mock.patch.object(communicators, "collective", collective),
    ):
        yield


def _run(
    name: str, device: torch.device, ppn: int, density: float, timing: bool, slow: bool, width: int
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The reduced gradient after STEPS backward passes, and what was counted."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)  # the same weights on every rank (DDP broadcasts them anyway)
    model = nn.Sequential(
        nn.Linear(64, width), nn.ReLU(), nn.Linear(width, width), nn.Linear(width, 10)
    ).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=1)
    opts: dict[str, Any] = {"density": density, "min_numel": 0, "timing": timing}
    state, hook = make_hook(name, **opts, **({"procs_per_node": ppn} if ppn else {}))
    ddp.register_comm_hook(state, hook)
    state.nan_check = True  # the reduced buckets' flags too, as train.nan_check=step
    sites: list[str] = []
    counted, finite, delays = 0, True, [0]
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(1000 * step + dist.get_rank())
        x = torch.randn(128, 64, generator=gen).to(device)
        ddp.zero_grad(set_to_none=False)
        loss = ddp(x).square().mean()
        before = host_syncs()
        with race(device, slow, delays), cuda_syncs(device.type == "cuda", sync_site) as found:
            loss.backward()
        counted += host_syncs() - before  # the selectors' own reads: this project's code
        sites += found
        flags = [ok for _, ok in state.take_finite() or ()]  # the loop's one read per step
        finite = finite and (not flags or bool(torch.stack(flags).all()))
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).float()
    stats = state.stats.pop()
    ours = [s for s in sites if s.startswith("bench ")]
    info = {"syncs": len(ours) + counted, "sync_sites": sorted(set(ours))[:5]}
    # torch's own (PowerSGD's copy): info only
    info.update(other_syncs=len(sites) - len(ours), other_sites=sorted(set(sites) - set(ours))[:5])
    info.update(delays=delays[0], finite=finite, select_s=stats.get("time/select_s", 0.0))
    return grad, {**info, "comm_s": stats.get("time/comm_s", 0.0)}


def cases(world: int, ppn: int, hooks: tuple[str, ...] = HOOKS) -> list[tuple]:
    """(hook, density, timing, race probe) of one layout, where the hook fits its nodes; the
    top-k hooks also at density 1.0 (against dense) and 0.25 (above 1/16, where selections
    change structure)."""
    out = []
    for h in hooks:
        spec = methods.get(h)
        if spec.min_nodes > world // max(ppn, 1):
            continue
        d = 0.01 if spec.sparse else 1.0
        if spec.sparse:
            out += [(h, 1.0, True, False), (h, 0.25, True, False)]
        out += [(h, d, True, False), (h, d, True, True), (h, d, False, False)]
    return out


def verdict(row: dict) -> list[str]:
    """What is wrong with one case ([]: it passed)."""
    bad = []
    if row["rank_diff"] != 0.0:
        bad.append(f"ranks differ by {row['rank_diff']:.3g}")
    if row["syncs"]:
        bad.append(f"{row['syncs']} host syncs in the hooks {row['sync_sites']}")
    # against the fp32 all-reduce at density 1: two roundings of a wire dtype the
    # compressor casts to (fp16, bf16), else 1e-5
    spec = methods.get(row["hook"])
    cast = getattr(COMPRESSORS.get(spec.comm), "target", None) if spec.comm in COMPRESSORS else None
    tol = 2 * torch.finfo(cast).eps if spec.wire_bytes < 4 and cast else 1e-5
    if row.get("dense_err", 0.0) > tol:
        bad.append(f"dense_err {row['dense_err']:.3g} > {tol:g}")
    if row.get("race_diff", 0.0) > RACE_TOL:
        bad.append(f"race probe changed the result by {row['race_diff']:.3g}")
    if row["race"] and not row.get("delays"):
        bad.append("race probe delayed nothing")
    if not row["finite"]:
        bad.append("non-finite selection flagged")
    return bad


def _layout(r: dict) -> str:
    return "nccl 1" if r["world"] == 1 else f"gloo {r['world'] // r['ppn']}x{r['ppn']}"


def line(r: dict) -> str:
    layout = _layout(r)
    text = (
        f"{'FAIL' if r['why'] else 'ok  '} {layout:<8} {r['hook']:<9} d={r['density']:<4g}"
        f" timing={int(r['timing'])} race={int(r['race'])} syncs={r['syncs']}"
        f" rank_diff={r['rank_diff']:.2g} dense_err={r.get('dense_err', float('nan')):.2g}"
        f" race_diff={r.get('race_diff', float('nan')):.2g}"
        f" comm_ms={1e3 * r['comm_s'] / STEPS:.2f} {'; '.join(r['why'])}"
    )
    if r["other_syncs"]:  # torch's own code, not judged
        text += f"\ninfo {layout} {r['hook']}: {r['other_syncs']} syncs outside bench/ "
        text += f"(not counted) at {r['other_sites']}"
    return text


def check_layout(
    rank: int,
    world: int,
    device_name: str,
    ppn: int,
    width: int,
    hooks: tuple[str, ...],
    out: str = "",
    timeout_s: float = 0.0,
) -> list[dict]:
    """Every case of one layout, on every rank; rank 0 prints each row, adds it to ``out``."""
    if timeout_s:  # a hang shows where each rank was, before the step is killed
        faulthandler.dump_traceback_later(timeout_s, exit=False)
    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    sink = Rows("hooks", out if rank == 0 else "", fresh=False)
    ref, _ = _run(methods.baseline(), device, ppn, 1.0, True, False, width)
    for name, density, timing, probe in cases(world, ppn, hooks):
        t0 = time.perf_counter()
        grad, info = _run(name, device, ppn, density, timing, False, width)
        row = {"hook": name, "density": density, "timing": timing, "race": probe, **info}
        row.update(world=world, ppn=ppn)
        if probe:  # the same case, delayed: must give what the undelayed run gave
            slow, rinfo = _run(name, device, ppn, density, timing, True, width)
            row["race_diff"] = float((slow - grad).abs().max()) / (float(grad.abs().max()) or 1.0)
            row["syncs"] += rinfo["syncs"]
            row["other_syncs"] += rinfo["other_syncs"]
            row["delays"] = rinfo["delays"]
        ref0 = grad.clone()  # the largest difference between this rank and rank 0
        dist.broadcast(ref0, 0)
        diff = (grad - ref0).abs().max()
        dist.all_reduce(diff, op=dist.ReduceOp.MAX)
        row["rank_diff"] = float(diff)
        if not methods.get(name).lossy and density == 1.0:
            row["dense_err"] = float((grad - ref).norm() / ref.norm())
        row["seconds"] = time.perf_counter() - t0
        row["why"] = verdict(row)
        if rank == 0:
            sink.add(row, line(row))
    faulthandler.cancel_dump_traceback_later()
    return sink.rows


LAYOUTS = ("1", "2x2", "4x1")  # NCCL world 1; 4 gloo workers as 2 nodes x 2, 4 nodes x 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpucheck.hooks", description=__doc__)
    ap.add_argument("--cpu", action="store_true", help="CPU tensors over gloo (plumbing only)")
    ap.add_argument("--out", default="", help="JSON file for every case (rows: its .jsonl)")
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="of: " + ",".join(LAYOUTS))
    ap.add_argument("--hooks", default=",".join(HOOKS), help="of: " + ",".join(HOOKS))
    ap.add_argument("--timeout-s", type=float, default=300.0, help="stop hung workers after")
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
    device, width = ("cpu", 64) if args.cpu else ("cuda:0", 1024)
    out = args.out or os.path.join(tempfile.mkdtemp(prefix="gpucheck-"), "hooks.json")
    deadline = time.monotonic() + args.timeout_s  # the gloo workers are stopped after it
    Rows("hooks", out)  # a fresh file for this run's rows, each kept as it is measured
    for lay in layouts:
        if lay == "1":
            with alone(device):
                check_layout(0, 1, device, 0, width, hooks, out)
            continue
        nodes, ppn = (int(v) for v in lay.split("x"))  # all the workers share the one GPU
        left = max(10.0, deadline - time.monotonic())
        case = (device, ppn, width, hooks, out, left - 5)
        run_workers(check_layout, nodes * ppn, ppn, *case, timeout_s=left)
    rows = read(out)[0]["rows"]
    failed = [{"layout": _layout(r), "hook": r["hook"], "why": r["why"]} for r in rows if r["why"]]
    if args.out:
        result = {"device": device, "rows": rows, "failed": failed}
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"hooks: {len(rows)} cases, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
