"""Overlap of gradient aggregation with the backward pass: per method a ResNet-18 DDP step, its
backward alone and its communication alone (the slowest rank's medians), on local workers
or under torchrun (``--out FILE``)."""

import argparse
import statistics
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.benchmarks.buckets import FakeBucket
from bench.benchmarks.spawn import torchrun_json
from bench.benchmarks.timing import interleaved_times
from bench.comm import is_sparse, make_hook

MODEL = "resnet18"


def _case(
    method: str,
    density: float,
    batch: int,
    image: int,
    warmup: int,
    reps: int,
    bucket_mb: float = 25.0,
) -> dict[str, Any]:
    # deferred: torchvision is slow to load, and only this path needs it
    import torchvision

    torch.manual_seed(0)
    ddp = DDP(torchvision.models.resnet18(num_classes=10), bucket_cap_mb=bucket_mb)
    state, hook = make_hook(method, density=density, powersgd_rank=4)
    shapes: dict[int, list[torch.Size]] = {}

    def recording(st: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        shapes[bucket.index()] = [g.shape for g in bucket.gradients()]  # DDP's own buckets
        return hook(st, bucket)

    ddp.register_comm_hook(state, recording)
    alone_state, alone_hook = make_hook(method, density=density, powersgd_rank=4)
    x = torch.randn(batch, 3, image, image)
    y = torch.randint(10, (batch,))

    def fwd_bwd() -> None:
        ddp.zero_grad(set_to_none=False)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()

    def backward_only() -> None:
        with ddp.no_sync():
            fwd_bwd()

    buckets: list[FakeBucket] = []
    layout: list[list[torch.Size]] = []

    def comm_alone() -> None:
        torch.futures.wait_all([alone_hook(alone_state, b) for b in buckets])

    def rebucket() -> None:  # DDP's buckets as its hook saw them (rebuilt after step 1)
        nonlocal buckets, layout
        now = [shapes[i] for i in sorted(shapes)]
        if now != layout:
            layout, n = now, len(now)
            buckets = [FakeBucket(i, now[i], i == n - 1, seed=i) for i in range(n)]

    def refill() -> None:
        for b in buckets:
            b.refill()

    out = interleaved_times(
        {"step": fwd_bwd, "backward": backward_only, "alone": comm_alone},
        warmup=warmup,
        reps=reps,
        slowest_rank=True,
        setup={"step": shapes.clear, "backward": rebucket, "alone": refill},
    )
    med = {k: statistics.median(v) for k, v in out.items()}
    exposed = med["step"] - med["backward"]
    ratio = exposed / med["alone"] if med["alone"] > 0 else float("nan")
    row = {"kind": "overlap", "model": MODEL, "method": method}
    row.update(density=density if is_sparse(method) else 1.0, batch=batch, image=image)
    row.update(buckets=len(buckets), bucket_cap_mb=bucket_mb, step_ms=med["step"])
    row.update(backward_ms=med["backward"], comm_alone_ms=med["alone"], exposed_ms=exposed)
    return {**row, "exposed_ratio": ratio, "hidden": min(1.0, max(0.0, 1 - ratio)), "reps": reps}


def overlap_worker(rank: int, world: int, methods: list[str], *case: Any) -> list[dict[str, Any]]:
    """One row per method; ``case``: :func:`_case`'s arguments after the method."""
    return [_case(m, *case) for m in methods]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--methods", required=True, help="comma-separated comm hooks")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's bucket_cap_mb")
    a = ap.parse_args(argv)
    case = (a.density, a.batch, a.image, a.warmup, a.reps, a.bucket_mb)
    return torchrun_json(a.out, lambda: [_case(m, *case) for m in a.methods.split(",")])


if __name__ == "__main__":
    raise SystemExit(main())
