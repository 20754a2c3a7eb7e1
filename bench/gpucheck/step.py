"""gpucheck step ``step``: a ResNet-50 DDP step per hook on NCCL world 1 against dense's (the
step, its tail after the last bucket, peak memory), then one profiled (its trace in
``<out dir>/step-traces/``); ``--cpu``: ResNet-18, small images, gloo."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from bench import methods
from bench.benchmarks.spawn import alone
from bench.benchmarks.timing import Clock
from bench.comm import make_hook
from bench.gpucheck.rows import Rows

# the benched per-step hooks that run on one node (hitopk needs two)
HOOKS = tuple(s.name for s in methods.specs(kind="hook") if s.benched and s.min_nodes == 1)
WARMUP = 3  # DDP rebuilds its buckets after the first step; PowerSGD compresses from the third
REPS = 5  # measured steps (2 on the CPU)
BUCKET_MB = 25
TOP = 12  # kernels (host ops on the CPU) named in a profile row


def trace_summary(prof: Any, device: torch.device) -> dict[str, Any]:
    """Where a profiled step's time went: the kernels by name (count, ms; the CPU: host ops by
    self time), busy time and idle gaps over its span, the host's time in ``hook``."""
    events = list(prof.events())
    gpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    work = gpu if device.type == "cuda" else [e for e in events if e.name != "hook"]
    by: dict[str, list[float]] = {}
    for e in work:
        c = by.setdefault(e.name, [0, 0.0])
        c[0] += 1
        c[1] += (e.device_time if device.type == "cuda" else e.self_cpu_time_total) / 1e3
    top = sorted(by.items(), key=lambda kv: -kv[1][1])[:TOP]
    out: dict[str, Any] = {
        "hook_host_ms": sum(e.cpu_time_total for e in events if e.name == "hook") / 1e3,
        "ops": len(work),
        "by_name": {n: [int(c), round(ms, 4)] for n, (c, ms) in by.items()},
        "top": [[n, int(c), round(ms, 4)] for n, (c, ms) in top],
    }
    if gpu:
        spans = sorted((e.time_range.start, e.time_range.end) for e in gpu)  # us
        busy, gaps, end = 0.0, [], None  # busy time and the idle gaps between, ms
        for a, b in spans:
            if end is None or a > end:
                if end is not None:
                    gaps.append((a - end) / 1e3)
                busy, end = busy + (b - a) / 1e3, b
            elif b > end:
                busy, end = busy + (b - end) / 1e3, b
        gaps.sort(reverse=True)
        out["span_ms"] = (max(b for _, b in spans) - spans[0][0]) / 1e3
        out.update(busy_ms=busy, idle_ms=out["span_ms"] - busy, gaps_ms=gaps[:5])
    return out


def measure(
    name: str, device: torch.device, cpu: bool, trace: str = ""
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Hook ``name``'s median step and tail (ms), peak memory (MiB), and one more step's
    profile summary (its trace to ``trace``)."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torchvision.models import resnet18, resnet50

    torch.manual_seed(0)
    model = resnet18(num_classes=10) if cpu else resnet50()
    model = model.to(device, memory_format=torch.channels_last)
    ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(model, device_ids=ids, bucket_cap_mb=BUCKET_MB, gradient_as_bucket_view=True)
    state, hook = make_hook(name, density=0.01, timing=False)
    clock, marks = Clock(device), []

    def timed(st, bucket):  # noqa: ANN001, ANN202 - DDP checks the bucket's annotation
        marks.append(clock.stamp())  # the bucket is ready: its gradients are written
        with torch.profiler.record_function("hook"):
            return hook(st, bucket)

    timed.__annotations__ = dict(hook.__annotations__)
    ddp.register_comm_hook(state, timed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch, px = (2, 32) if cpu else (64, 224)
    x = torch.randn(batch, 3, px, px, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=device)

    def step() -> tuple[float, float]:
        marks.clear()
        t0 = clock.stamp()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(ddp(x).float(), y)
        loss.backward()  # returns once DDP made this stream wait on every bucket's future
        t1 = clock.stamp()
        opt.step()
        opt.zero_grad(set_to_none=False)
        t2 = clock.stamp()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return clock.ms(t0, t2), clock.ms(marks[-1], t1)

    for _ in range(WARMUP):
        step()
    if clock.cuda:  # the peak of the measured steps alone
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    timed_steps = [step() for _ in range(2 if cpu else REPS)]
    row = {
        "hook": name,
        "buckets": len(marks),
        "step_ms": statistics.median(s for s, _ in timed_steps),
        "tail_ms": statistics.median(t for _, t in timed_steps),
        "peak_mib": torch.cuda.max_memory_allocated(device) / 2**20 if clock.cuda else None,
    }
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        profiled_ms, _ = step()
    if trace:
        Path(trace).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(trace)
    return row, {"hook": name, "step_ms": profiled_ms, **trace_summary(prof, device)}


def run(cpu: bool, hooks: tuple[str, ...], sink: Rows, traces: str = "") -> None:
    """Every hook, dense first, each against dense, then its profile (``traces``: their folder)."""
    device = torch.device("cpu" if cpu else "cuda:0")
    with alone(str(device), timeout_s=120):
        dense: dict[str, Any] = {}
        dense_prof: dict[str, Any] = {}
        base = methods.baseline()
        for name in (base, *[h for h in hooks if h != base]):
            trace = str(Path(traces) / f"{name}.json.gz") if traces else ""
            row, prof = measure(name, device, cpu, trace)
            dense, dense_prof = dense or row, dense_prof or prof
            row["x_dense_step"] = row["step_ms"] / dense["step_ms"]
            row["tail_minus_dense_ms"] = row["tail_ms"] - dense["tail_ms"]
            if row["peak_mib"] is not None:
                row["peak_minus_dense_mib"] = row["peak_mib"] - dense["peak_mib"]
            sink.add({"device": str(device), **row})
            # the kernels (host ops) whose time it adds to dense's: [name, ms more, calls more]
            base, more = dense_prof.get("by_name", {}), []
            for n, (c, ms) in prof.get("by_name", {}).items():
                c0, ms0 = base.get(n, [0, 0.0])
                if ms - ms0 > 0:
                    more.append([n, round(ms - ms0, 4), c - c0])
            prof["added"] = sorted(more, key=lambda m: -m[1])[:TOP]
            p = {k: v for k, v in prof.items() if k != "by_name"}
            gpu = f" busy {p['busy_ms']:.1f} idle {p['idle_ms']:.1f} ms" if "busy_ms" in p else ""
            more = ", ".join(f"{n[:40]} +{ms:.2f} ms ({c:+d})" for n, ms, c in p["added"][:5])
            line = (
                f"step profile {name}: {p['step_ms']:.1f} ms,{gpu} hook host"
                f" {p['hook_host_ms']:.1f} ms, {p['ops']} ops; adds: {more or 'nothing'}"
            )
            sink.add({"what": "profile", "device": str(device), **p}, line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpucheck.step", description=__doc__)
    ap.add_argument("--cpu", action="store_true", help="ResNet-18, small images, gloo")
    ap.add_argument("--out", default="", help="JSON file for the rows (as measured: its .jsonl)")
    ap.add_argument("--hooks", default=",".join(HOOKS), help="of: " + ",".join(HOOKS))
    args = ap.parse_args(argv)
    hooks = tuple(h for h in args.hooks.split(",") if h)
    unknown = [h for h in hooks if h not in HOOKS]
    if unknown:
        print(f"step: unknown hooks: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if not args.cpu and not torch.cuda.is_available():
        print("step: no CUDA device; --cpu checks the plumbing only")
        return 2
    try:
        import torchvision  # noqa: F401
    except ImportError:
        print("step: no torchvision here: ResNet-50 is not measured", file=sys.stderr)
        return 2
    sink = Rows("step", args.out)
    run(args.cpu, hooks, sink, str(Path(args.out).parent / "step-traces") if args.out else "")
    sink.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
