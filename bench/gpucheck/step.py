"""One DDP training step per hook on one process (gpucheck step ``step``).

``python -m bench.gpucheck.step [--cpu] [--out FILE]``: ResNet-50 (bf16 autocast,
channels-last, 25 MB buckets) on NCCL with world 1, one SGD step per hook, timed with CUDA
events: the whole step, and the time from the last bucket handed to the hook to the end
of backward (the hook's work left on the critical path), and peak memory, against the
dense hook of the same run.  ``--cpu``: ResNet-18 on small images over gloo (plumbing).
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from bench.benchmarks.spawn import free_port
from bench.comm import make_hook
from bench.gpucheck.rows import Rows

HOOKS = ("dense", "bf16", "powersgd", "topk", "mstopk")  # hitopk needs two nodes
WARMUP = 3  # DDP rebuilds its buckets after the first step; PowerSGD compresses from the third
REPS = 5  # measured steps (2 on the CPU)
BUCKET_MB = 25


class _Clock:
    """Stamps on the current stream: CUDA events on a GPU, the host clock on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def stamp(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def ms(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) if self.cuda else 1e3 * (b - a)


def _model(device: torch.device, cpu: bool) -> torch.nn.Module:
    from torchvision.models import resnet18, resnet50

    torch.manual_seed(0)
    model = resnet18(num_classes=10) if cpu else resnet50()
    return model.to(device, memory_format=torch.channels_last)


def measure(name: str, device: torch.device, cpu: bool) -> dict[str, Any]:
    """The median step and tail (ms) of hook ``name`` and the peak memory (MiB) of a step."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _model(device, cpu)
    ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(model, device_ids=ids, bucket_cap_mb=BUCKET_MB, gradient_as_bucket_view=True)
    state, hook = make_hook(name, density=0.01, timing=False)
    clock = _Clock(device)
    marks: list[Any] = []

    def timed(st, bucket):  # noqa: ANN001, ANN202 - DDP checks the bucket's annotation
        marks.append(clock.stamp())  # the bucket is ready: its gradients are written
        return hook(st, bucket)

    timed.__annotations__ = dict(hook.__annotations__)
    ddp.register_comm_hook(state, timed)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch, px = (2, 32) if cpu else (64, 224)
    x = torch.randn(batch, 3, px, px, device=device).to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (batch,), device=device)
    steps, tails = [], []
    for i in range(WARMUP + (2 if cpu else REPS)):
        if i == WARMUP and device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(device)
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
        if i >= WARMUP:
            steps.append(clock.ms(t0, t2))
            tails.append(clock.ms(marks[-1], t1))
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {
        "hook": name,
        "buckets": len(marks),
        "step_ms": statistics.median(steps),
        "tail_ms": statistics.median(tails),
        "peak_mib": peak,
    }


def run(cpu: bool, hooks: tuple[str, ...], sink: Rows) -> None:
    """Every hook of ``hooks``, dense first; each row against the dense one."""
    device = torch.device("cpu" if cpu else "cuda:0")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    backend = "gloo" if cpu else "nccl"
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group(backend, rank=0, world_size=1, timeout=timeout)
    try:
        dense: dict[str, Any] = {}
        for name in ("dense", *[h for h in hooks if h != "dense"]):
            row = measure(name, device, cpu)
            dense = dense or row
            row["x_dense_step"] = row["step_ms"] / dense["step_ms"]
            row["tail_minus_dense_ms"] = row["tail_ms"] - dense["tail_ms"]
            if row["peak_mib"] is not None:
                row["peak_minus_dense_mib"] = row["peak_mib"] - dense["peak_mib"]
            sink.add({"device": str(device), **row})
    finally:
        dist.destroy_process_group()


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
        print("step: no torchvision here: ResNet-50 is not measured")
        return 0
    sink = Rows("step", args.out)
    run(args.cpu, hooks, sink)
    sink.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
