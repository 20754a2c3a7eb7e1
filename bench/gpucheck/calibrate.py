"""gpucheck step ``calibrate``: per model, what :mod:`bench.cluster.perfmodel` prices, one row
per quantity in seconds (with ``--cpu`` also the loopback path between two gloo workers),
appended to the CSV :mod:`bench.cluster.calibration` reads (docs/internals/gpucheck.md)."""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.benchmarks.timing import median_s
from bench.cluster.calibration import FIELDS, device_slug
from bench.comm.cost import k_for
from bench.comm.selection import SELECTORS
from bench.comm.selection_core import deferred_finite
from bench.gpucheck.rows import Rows

MODELS = ("resnet50", "transformer_base")  # the paper's ImageNet model, the Transformer shape
CPU_MODELS = ("resnet9", "transformer_tiny")  # what the CPU's emulated runs train
DENSITIES = (0.001, 0.01)
WORLD = 8  # workers whose pairs one scatter-add receives (the paper's node)
RANK = 4  # PowerSGD's matrix_approximation_rank (conf/comm/powersgd.yaml)
MIN_REPS = 15  # calls of which the fastest times a low-rank product or QR, and a message
BUCKET_MB = 25.0
# (batch, px) of an image model; (sentences, tokens each side) of a Transformer: the
# paper's 64 images per GPU and the throughput benchmark's Transformer batch on CUDA,
# batches of about a second on the CPU; the digits recipe's 32 px for ResNet-9
SHAPES = {
    "cuda": {"resnet50": (64, 224), "transformer_base": (128, 64)},
    "cpu": {"resnet50": (4, 224), "transformer_base": (8, 32), "resnet9": (64, 32),
            "transformer_tiny": (16, 32)},
}  # fmt: skip
VOCAB = 32000
CLASSES = {"resnet50": 1000}  # else 10 (digits)


def _model(name: str, device: torch.device) -> tuple[torch.nn.Module, Callable[[], Any], int]:
    """``(model, one forward-backward, samples per step)``."""
    from bench.models import build_model
    from bench.models.config import ModelConfig

    batch, size = SHAPES[device.type].get(name) or SHAPES["cpu"][name]
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    if name.startswith("transformer"):
        net = build_model(ModelConfig(name=name), VOCAB).to(device)
        src = torch.randint(4, VOCAB, (batch, size), device=device)
        tgt = torch.randint(4, VOCAB, (batch, size + 1), device=device)

        def loss() -> torch.Tensor:
            logits = net(src, tgt[:, :-1]).float()
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())

    else:
        fmt = torch.channels_last if cuda else torch.contiguous_format
        classes = CLASSES.get(name, 10)
        net = build_model(ModelConfig(name=name), classes).to(device, memory_format=fmt)
        x = torch.randn(batch, 3, size, size, device=device).to(memory_format=fmt)
        y = torch.randint(0, classes, (batch,), device=device)

        def loss() -> torch.Tensor:
            return torch.nn.functional.cross_entropy(net(x).float(), y)

    def fwd_bwd() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            out = loss()
        out.backward()

    return net, fwd_bwd, batch


def _lowrank(grads: list[torch.Tensor], rank: int) -> Callable[[], None]:
    """PowerSGD's compute of one step over every matrix: ``P = M Q``, P orthogonalised,
    ``Q = M^T P`` (torch's hook functions, without the allreduces)."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

    mats = [g.reshape(g.shape[0], -1) for g in grads if g.dim() > 1]
    qs = [torch.randn(m.shape[1], min(rank, *m.shape), device=m.device) for m in mats]

    def run() -> None:
        for m, q in zip(mats, qs, strict=True):
            p = (m @ q).unsqueeze(0)  # a batch of one, as the hook orthogonalises
            _orthogonalize(p)
            torch.matmul(m.t(), p[0], out=q)

    return run


def _lowrank_rates(grads: list[torch.Tensor], rank: int, timed: dict) -> dict[str, tuple]:
    """PowerSGD's ``M Q`` (2 n m r flops) and QR of P (n x r, 2 n r^2 flops) per distinct
    matrix shape, fitted as ``call + flops * per_flop``: {"matmul"|"qr": (call s, s per flop,
    shapes)}.  Each time is the fastest of ``MIN_REPS`` calls: on a shared machine the median
    of short calls is set by preemption (at load 9 on 2 cores a call read 16 ms)."""
    from bench.benchmarks.timing import interleaved_times
    from bench.cluster.perfmodel import fit_alpha_beta

    reps = max(MIN_REPS, timed["reps"])

    def fastest_s(fn: Callable[[], Any]) -> float:
        return min(interleaved_times({0: fn}, **{**timed, "reps": reps})[0]) / 1e3

    shapes = sorted({(g.shape[0], g[0].numel()) for g in grads if g.dim() > 1})
    got: dict[str, list[tuple[float, float]]] = {"matmul": [], "qr": []}
    for n, m in shapes:
        r = min(rank, n, m)
        mat = torch.randn(n, m, device=grads[0].device)
        q = torch.randn(m, r, device=mat.device)
        p = mat @ q
        s = fastest_s(lambda mat=mat, q=q, p=p: torch.matmul(mat, q, out=p))
        got["matmul"].append((2.0 * n * m * r, s))
        got["qr"].append((2.0 * n * r * r, fastest_s(lambda p=p: torch.linalg.qr(p.unsqueeze(0)))))
    out = {}
    for q, pts in got.items():
        call, rate = fit_alpha_beta([f for f, _ in pts], [t for _, t in pts])
        out[q] = (call, 1.0 / rate, len(pts))
    return out


def _demo(net: torch.nn.Module) -> Callable[[], None]:
    """DeMo's own work in one step: ``DeMo.extract`` of each parameter, then the inverse of an
    average as a decoding worker."""
    from bench.optim.config import OptimConfig
    from bench.optim.demo import DeMo

    cfg = OptimConfig()
    params = [p for p in net.parameters() if p.requires_grad]
    opt = DeMo(params, chunk=cfg.demo_chunk, topk=cfg.demo_topk)

    def run() -> None:
        for p in params:
            ch, values, idx, _ = opt.extract(p, 0.999)
            ch.tensor(ch.scatter(values, idx))

    return run


def measure(name: str, device: torch.device, reps: int) -> list[dict[str, Any]]:
    """Rows of (quantity, seconds, per what, n) of model ``name``."""
    from bench.cluster.projection import ddp_buckets

    cuda = device.type == "cuda"
    timed = {"warmup": 1 if not cuda else 3, "reps": reps, "events": cuda}
    net, fwd_bwd, batch = _model(name, device)
    rows: list[dict[str, Any]] = []

    def add(quantity: str, s: float, per: str, n: int, **extra: Any) -> None:
        rows.append({"model": name, "quantity": quantity, "value": s, "per": per, "n": n,
                     "batch": batch, **extra})  # fmt: skip

    if cuda:
        torch.backends.cudnn.benchmark = True
    numel = sum(p.numel() for p in net.parameters() if p.requires_grad)
    add("fwd_bwd_s", median_s(fwd_bwd, **timed), "step", numel,
        precision="bf16+channels_last" if cuda else "fp32")  # fmt: skip
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-5, foreach=True)
    add("update_s", median_s(opt.step, **timed), "step", numel)
    grads = [p.grad for p in params]
    add("lowrank_s", median_s(_lowrank(grads, RANK), **timed), "step", numel, rank=RANK)
    for q, (call, per_flop, n) in _lowrank_rates(grads, RANK, timed).items():
        add(f"{q}_s", per_flop, "flop", n, rank=RANK)
        add(f"{q}_call_s", call, "call", n, rank=RANK)
    add("dct_s", median_s(_demo(net), **timed), "step", numel)
    del opt
    buckets, _ = ddp_buckets(net, BUCKET_MB)
    d = max(buckets)
    del net, params, grads, fwd_bwd
    gen = torch.Generator(device).manual_seed(1)
    x = torch.randn(d, device=device, generator=gen)
    y = torch.randn(d, device=device, generator=gen)
    add("reduce_s", median_s(lambda: x.add_(y), **timed) / d, "element", d)
    add("dense_s", median_s(lambda: x.mul_(1.0), **timed) / d, "element", d)
    for density in DENSITIES:
        k = k_for(d, density)
        for sel, fn in SELECTORS.items():

            def call(fn: Callable = fn, k: int = k) -> Any:  # as a hook: the flag deferred
                with deferred_finite([]):
                    return fn(x, k)

            add(f"select_s[{sel}]", median_s(call, **timed) / d, "element", d, density=density)
        pairs = WORLD * k
        v = torch.randn(pairs, device=device, generator=gen)
        i = torch.randint(d, (pairs,), device=device, generator=gen)
        out = torch.zeros(d, device=device)
        s = median_s(lambda out=out, i=i, v=v: out.index_add_(0, i, v), **timed)
        add("scatter_s", s / pairs, "pair", pairs, density=density)
    return rows


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.is_file() or path.stat().st_size == 0
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpucheck.calibrate", description=__doc__)
    ap.add_argument("--cpu", action="store_true", help="measure this CPU (its own rows)")
    ap.add_argument("--out", default="", help="JSON file for the rows (as measured: its .jsonl)")
    ap.add_argument("--csv", default="", help="the CSV to append to (default: <results>/"
                    "calibration/<device>.csv, <results> above --out's folder)")  # fmt: skip
    every = MODELS + CPU_MODELS
    ap.add_argument("--models", default="", help=f"of: {','.join(every)} (default: "
                    f"{','.join(MODELS)}; on the CPU all)")  # fmt: skip
    ap.add_argument("--reps", type=int, default=0, help="timed calls each (default 5, CPU 3)")
    args = ap.parse_args(argv)
    models = tuple(m for m in args.models.split(",") if m) or (every if args.cpu else MODELS)
    unknown = [m for m in models if m not in every]
    if unknown:
        print(f"calibrate: unknown models: {', '.join(unknown)}", file=sys.stderr)
        return 2
    if not args.cpu and not torch.cuda.is_available():
        print("calibrate: no CUDA device; --cpu measures this CPU", file=sys.stderr)
        return 2
    from bench.results.env import cpu_model, git_sha, hardware

    device = torch.device("cpu" if args.cpu else "cuda:0")
    named = cpu_model() if args.cpu else torch.cuda.get_device_name(device)
    meta = {"device": named, "hardware": hardware(), "git_sha": git_sha() or "",
            "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__,
            "threads": torch.get_num_threads()}  # fmt: skip
    base = Path(args.out).parent.parent if args.out else Path("results")  # <results>/gpucheck/
    path = Path(args.csv) if args.csv else base / "calibration" / f"{device_slug(named)}.csv"
    sink = Rows("calibrate", args.out)
    reps = args.reps or (3 if args.cpu else 5)
    try:
        if "resnet50" in models:
            import torchvision  # noqa: F401
    except ImportError:
        print("calibrate: no torchvision here: ResNet-50 is not measured", file=sys.stderr)
        return 2
    for name in models:
        load = {"loadavg_1m": round(os.getloadavg()[0], 2)}  # a shared machine's load
        rows = [{**meta, **load, **r} for r in measure(name, device, reps)]
        for r in rows:
            sink.add(r)
        write_csv(rows, path)  # each model's rows as soon as they are measured
    if args.cpu:  # an emulated node's intra-node path: gloo over loopback, 2 workers
        from bench.benchmarks.spawn import run_workers
        from bench.cluster.calibration import LOOPBACK
        from bench.cluster.perfmodel import fit_alpha_beta
        from bench.sweeps.scaling_model import SHIFT_BYTES, ring_shift

        # the fastest of MIN_REPS shifts: the least preempted on a shared machine
        shift = run_workers(ring_shift, 2, 2, list(SHIFT_BYTES), MIN_REPS, min)[0]
        lat, bw = fit_alpha_beta([b for b, _ in shift], [t for _, t in shift])
        load = {"loadavg_1m": round(os.getloadavg()[0], 2), "model": LOOPBACK, "batch": None}
        rows = [{**meta, **load, "quantity": "loopback_lat_s", "value": lat, "per": "message",
                 "n": len(shift)},
                {**meta, **load, "quantity": "loopback_s", "value": 1 / bw, "per": "byte",
                 "n": max(b for b, _ in shift)}]  # fmt: skip
        for r in rows:
            sink.add(r)
        write_csv(rows, path)
    sink.finish(csv=str(path))
    print(f"calibrate: rows in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
