"""gpucheck steps ``select``, ``update`` and ``profile``, torch only: device measurements against
memory floors; ``--cpu`` checks the plumbing at small sizes (docs/internals/gpucheck.md)."""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from bench.benchmarks.spawn import alone
from bench.benchmarks.timing import Clock, median_s
from bench.comm.cost import k_for
from bench.comm.selection import _TRITON_BROKEN, host_syncs, mstopk
from bench.comm.selection_core import deferred_finite
from bench.gpucheck.rows import Rows
from bench.models.config import ModelConfig
from bench.models.transformer import build
from bench.optim import build_optimizer
from bench.optim.config import OptimConfig
from bench.optim.layout import ddp_like_buckets

UPDATE_BYTES = {"sgd": 20, "adamw": 28}  # per parameter: p, g, state(s) read, p, state written
PROBE_BYTES = 1 << 30  # the bandwidth probe's buffer (CUDA; 32 MiB on the CPU)
PROFILE_SHAPES = ((64, 224), (256, 224))  # images, px: the paper-scaled profile's two
CUDNN_BENCHMARK_LIMIT = 2  # algorithms cuDNN tries per shape: 12-15 s a shape at its default


def gpu_work(fn: Callable[[], Any], device: torch.device) -> tuple[int, float | None]:
    """``(kernels, busy ms)`` of one call of ``fn`` (torch's profiler); ``(0, None)`` on a CPU."""
    if device.type != "cuda":
        return 0, None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = [
        e
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
        and not e.name.lower().startswith("memcpy")  # copies, not kernels
    ]
    return len(ev), sum(e.device_time for e in ev) / 1e3  # device_time: us


def bandwidth(device: torch.device, reps: int = 10) -> dict[str, float]:
    """Memory bandwidth, bytes/s, of a read (``torch.amax``) and a copy of :data:`PROBE_BYTES`;
    ``bytes_s``, the faster, is the floors' denominator."""
    size = PROBE_BYTES if device.type == "cuda" else 32 << 20
    src = torch.ones(size // 4, device=device)
    dst = torch.empty_like(src)
    events = device.type == "cuda"
    read = median_s(lambda: torch.amax(src), warmup=2, reps=reps, events=events)
    copy = median_s(lambda: dst.copy_(src), warmup=2, reps=reps, events=events)
    out = {"read_bytes_s": size / read, "copy_bytes_s": 2 * size / copy}
    out["bytes_s"] = max(out.values())
    return out


def _hook_path(kernel: str) -> Callable[[torch.Tensor, int], Any]:
    """``mstopk`` as a DDP hook calls it: the finiteness flag handed on, not read."""

    def call(x: torch.Tensor, k: int) -> Any:
        with deferred_finite([]):  # the CUDA structure on the CPU too (--cpu: plumbing)
            return mstopk(x, k, "tiled", kernel=kernel, _device_path=True)

    return call


def graphed(fn: Callable[[], Any]) -> tuple[Callable[[], Any], Any]:
    """``(replay, outputs)``: ``fn`` captured in a CUDA graph (each replay rewrites outputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph.replay, out


def select(device: torch.device, cpu: bool, sink: Rows) -> None:
    """torch.topk against MSTopK ``tiled`` as a hook runs it, eager and graphed, and its torch
    structure: checked against torch.topk's magnitudes; ms, GPU busy ms, kernels and host
    syncs per call, times the floors; bfloat16 at the smaller size."""
    cuda = device.type == "cuda"
    bw = bandwidth(device)
    sink.add({"what": "bandwidth", **bw})
    sizes = (256_000, 1_000_000) if cpu else (25_600_000, 100_000_000)
    reps = 3 if cpu else 20
    methods: dict[str, Callable[[torch.Tensor, int], Any]] = {
        "torch.topk": lambda x, k: torch.topk(x.abs(), k, sorted=False),
        "mstopk": _hook_path("auto"),
        "mstopk-torch": _hook_path("torch"),
    }
    for n, dtype in [(n, torch.float32) for n in sizes] + [(sizes[0], torch.bfloat16)]:
        gen = torch.Generator(device).manual_seed(n)
        x = torch.randn(n, device=device, generator=gen).to(dtype)
        read = median_s(lambda x=x: torch.amax(x), warmup=1, reps=reps, events=cuda)
        floor = x.element_size() * n / bw["bytes_s"]
        want = torch.topk(x.abs().float(), max(k_for(n, d) for d in (0.001, 0.01))).values
        for density, (name, fn) in itertools.product((0.001, 0.01), methods.items()):
            k = k_for(n, density)
            call = functools.partial(fn, x, k)
            runs = [(name, call, call())]  # the first call compiles and settles
            if cuda and name != "mstopk-torch":
                try:
                    replay, out = graphed(call)
                    runs.append((f"{name} graph", replay, out))
                except Exception as e:  # noqa: BLE001 - the row says why
                    print(f"select: {name} n={n} d={density} not captured: {e!r}")
            for label, run, got in runs:
                before = host_syncs()
                run()
                syncs = host_syncs() - before
                s = median_s(run, warmup=1, reps=reps, events=cuda)
                if label.endswith("graph"):
                    torch.cuda.synchronize()
                # what ran: the radix path's Triton kernels, or the torch structure (asked
                # for, on the CPU, or once the kernels failed here: _TRITON_BROKEN)
                ops = label.startswith("mstopk-torch") or not cuda or "radix" in _TRITON_BROKEN
                kernel = "torch" if ops else "triton-radix"
                row = {"n": n, "dtype": str(dtype).removeprefix("torch."), "density": density}
                row.update(method=label, kernel=kernel if label.startswith("mstopk") else name)
                # the k largest magnitudes (ties may pick other indices of the same magnitude)
                idx = got[1] if isinstance(got, tuple) else got.indices
                have = torch.sort(x[idx].abs().float(), descending=True).values
                exact = idx.numel() == k and bool(torch.equal(have, want[:k]))
                row.update(exact=exact, ms=1e3 * s)
                row["kernels"], row["busy_ms"] = gpu_work(run, device)
                row.update(x_floor=s / floor, x_read=s / read, syncs=syncs)
                sink.add(row)
        del x
    if _TRITON_BROKEN:
        print(f"select: Triton kernels fell back to torch: {_TRITON_BROKEN}")


def select_targets(rows: list[dict]) -> list[str]:
    """The selection targets, met or missed: ``mstopk`` within 2.5x of the floor at the largest
    size; at the smallest 3x faster than torch.topk and faster than it graphed."""
    rows = [r for r in rows if r.get("dtype") == "float32" and "method" in r]
    if not rows:
        return []
    ms = {(r["n"], r["density"], r["method"]): r["ms"] for r in rows}
    floor = {(r["n"], r["density"]): r["x_floor"] for r in rows if r["method"] == "mstopk"}
    big, small = max(r["n"] for r in rows), min(r["n"] for r in rows)
    out: list[str] = []
    for d in (0.001, 0.01):
        if (big, d) in floor:
            x, ok = floor[big, d], "met" if floor[big, d] <= 2.5 else "MISSED"
            out.append(f"mstopk {big / 1e6:g} M d={d}: {x:.2f}x the floor (<= 2.5x) {ok}")
        mine, tk, tg = (ms.get((small, d, m)) for m in ("mstopk", "torch.topk", "torch.topk graph"))
        head = f"mstopk {small / 1e6:g} M d={d}:"
        if mine and tk:
            ok = "met" if tk / mine >= 3 else "MISSED"
            out.append(f"{head} {tk / mine:.2f}x faster than torch.topk (>= 3x) {ok}")
        if mine and tg:
            ok = "met" if tg / mine > 1 else "MISSED"
            out.append(
                f"{head} {tg / mine:.2f}x faster than torch.topk in a CUDA graph (> 1x) {ok}"
            )
    return out


def _models(cpu: bool) -> dict[str, Callable[[], torch.nn.Module]]:
    out: dict[str, Callable[[], torch.nn.Module]] = {}
    try:
        from torchvision.models import resnet18, resnet50

        out["resnet50"] = (lambda: resnet18(num_classes=10)) if cpu else (lambda: resnet50())
    except ImportError:
        print("update/profile: no torchvision here: ResNet-50 is not measured")
    name = "transformer_tiny" if cpu else "transformer_base"
    out["transformer_base"] = lambda: build(name, ModelConfig(name=name), 1000 if cpu else 32000)
    return out


def update(device: torch.device, cpu: bool, sink: Rows) -> None:
    """An optimizer step per model, optimizer and mode, over own gradients and bucket views."""
    reps = 3 if cpu else 30
    bw = bandwidth(device)
    sink.add({"what": "bandwidth", **bw})
    modes = (("fused", "off"), ("flat", "off"), ("flat", "bf16"))
    for model_name, make in _models(cpu).items():
        for opt in ("sgd",) if cpu else ("sgd", "adamw"):
            for (update_mode, master), grads in itertools.product(modes, ("own", "ddp")):
                if cpu and update_mode == "fused":
                    continue  # torch's fused kernels: CUDA (and recent CPUs) only
                torch.manual_seed(0)
                model = make().to(device)
                fields = {**OptimConfig().__dict__, "name": opt, "update": update_mode}
                cfg = SimpleNamespace(**{**fields, "master_weights": master})
                optimizer = build_optimizer(model, cfg)
                for p in model.parameters():
                    p.grad = torch.randn_like(p).mul_(1e-3)
                if grads == "ddp":  # p.grad: views into DDP-like buckets, values kept
                    ddp_like_buckets(list(model.parameters()))
                numel = sum(p.numel() for p in model.parameters())
                s = median_s(optimizer.step, reps=reps, events=device.type == "cuda")
                floor = UPDATE_BYTES[opt] * numel / bw["bytes_s"]
                mode = update_mode + ("+bf16 masters" if master != "off" else "")
                row = {"model": model_name, "optimizer": opt, "mode": mode, "grads": grads}
                row.update(params_m=numel / 1e6, ms=1e3 * s, x_floor=s / floor)
                row["kernels"] = gpu_work(optimizer.step, device)[0]
                sink.add(row)
                del model, optimizer


def profile(device: torch.device, cpu: bool, sink: Rows) -> None:
    """ResNet-50 forward + backward per step, then when each DDP bucket reaches the hook (ms
    into backward, one process)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    make = _models(cpu).get("resnet50")
    if make is None:
        return
    torch.backends.cudnn.benchmark_limit = CUDNN_BENCHMARK_LIMIT
    model = make().to(device, memory_format=torch.channels_last)
    for batch, px in ((2, 32), (4, 64)) if cpu else PROFILE_SHAPES:
        x = torch.randn(batch, 3, px, px, device=device).to(memory_format=torch.channels_last)

        def step(x: torch.Tensor = x) -> None:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model(x).float().square().mean()
            loss.backward()

        t0 = time.perf_counter()  # the warm-up call: cuDNN picks its algorithms
        s = median_s(step, reps=2 if cpu else 5, events=device.type == "cuda")
        row = {"what": "compute", "images": batch, "px": px, "ms": 1e3 * s}
        sink.add({**row, "img_s": batch / s, "seconds": time.perf_counter() - t0})
        del x
    with alone(str(device)):
        model = make().to(device, memory_format=torch.channels_last)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        clock, marks = Clock(device), []

        # no annotation on bucket: DDP refuses any but dist.GradBucket, which this module's
        # postponed (string) annotations are not
        def hook(state, bucket):  # noqa: ANN001, ANN202
            marks.append((bucket.index(), bucket.buffer().numel(), clock.stamp()))
            return allreduce_hook(state, bucket)

        ddp.register_comm_hook(None, hook)
        batch, px = (4, 64) if cpu else (64, 224)
        x = torch.randn(batch, 3, px, px, device=device).to(memory_format=torch.channels_last)
        for _ in range(3):  # DDP rebuilds its buckets after the first step
            marks.clear()
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = ddp(x).float().square().mean()
            start = clock.stamp()
            loss.backward()
            if clock.cuda:
                torch.cuda.synchronize()
    for index, numel, stamp in marks:
        row = {"what": "bucket", "bucket": index, "mb": numel * 4 / 2**20}
        sink.add({**row, "ready_ms": clock.ms(start, stamp)})


CHECKS: dict[str, Callable[[torch.device, bool, Rows], None]] = dict(
    select=select, update=update, profile=profile
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpucheck.perf", description=__doc__)
    ap.add_argument("check", choices=sorted(CHECKS))
    ap.add_argument("--cpu", action="store_true", help="small sizes on the CPU (plumbing only)")
    ap.add_argument("--out", default="", help="JSON file for the rows (as measured: its .jsonl)")
    args = ap.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print(f"{args.check}: no CUDA device; --cpu checks the plumbing only")
        return 2
    device = torch.device("cpu" if args.cpu else "cuda:0")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    sink = Rows(args.check, args.out)
    CHECKS[args.check](device, args.cpu, sink)
    targets = select_targets(sink.rows) if args.check == "select" else []
    for line in targets:
        print(f"target: {line}")
    # what a check found wrong: a selection that is not the top k
    failed = [
        f"{r['method']} n={r['n']} {r['dtype']} d={r['density']}: not the top k"
        for r in sink.rows
        if r.get("exact") is False
    ]
    for line in failed:
        print(f"FAIL {args.check}: {line}")
    sink.finish(targets=targets, failed=failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
