"""``bench throughput``: ResNet-50 images/s and ``transformer_base`` tokens/s on synthetic
data, bf16 (+ channels-last) and TF32 steps interleaved, beside NVIDIA's published ResNet-50
number for scale; columns and protocol: docs/internals/benchmarks.md."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from bench.benchmarks import BENCHMARKS, BenchmarkSpec
from bench.benchmarks.harness import BenchRun
from bench.benchmarks.timing import interleaved_times
from bench.models import build_model
from bench.models.config import ModelConfig
from bench.results.plots import BENCH_COLOURS, save_figure

ANCHOR_IMAGES_PER_S = 2470.0
ANCHOR = (
    "NVIDIA DeepLearningExamples ResNet-50 v1.5 PyTorch, 1x A100 80GB, mixed precision, "
    "DALI input, NGC 21.03"
)
CASES = {  # name -> (autocast dtype or None, channels_last)
    "bf16+channels_last": (torch.bfloat16, True),
    "bf16": (torch.bfloat16, False),
    "tf32": (None, False),
}


def _step(
    device: torch.device, amp: Any, model: str, batch: int, size: int, channels_last: bool = False
) -> Callable[[], None]:
    """One training step on one synthetic batch: ResNet-50 (SGD) on ``size`` px images, or a
    registry Transformer (AdamW) on ``batch`` sentences of ``size`` tokens each side."""
    torch.manual_seed(0)
    cuda = device.type == "cuda"
    if model == "resnet50":
        # deferred: torchvision is slow to load, and only this path needs it
        import torchvision

        fmt = torch.channels_last if channels_last else torch.contiguous_format
        net = torchvision.models.resnet50().to(device, memory_format=fmt)
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-5, fused=cuda)
        x = torch.randn(batch, 3, size, size, device=device).to(memory_format=fmt)
        y = torch.randint(0, 1000, (batch,), device=device)

        def loss() -> torch.Tensor:
            return F.cross_entropy(net(x), y)

    else:
        vocab = 32000
        net = build_model(ModelConfig(name=model), vocab).to(device)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4, betas=(0.9, 0.98), fused=cuda)
        # ids from 4 up: 0-3 are pad, unk, bos and eos
        src = torch.randint(4, vocab, (batch, size), device=device)
        tgt = torch.randint(4, vocab, (batch, size + 1), device=device)

        def loss() -> torch.Tensor:
            logits = net(src, tgt[:, :-1]).float().flatten(0, 1)
            return F.cross_entropy(logits, tgt[:, 1:].flatten(), label_smoothing=0.1)

    def step() -> None:
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=bool(amp)):
            out = loss()
        out.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def run(results_dir: str = "results", quick: bool = False) -> Path:
    cuda = torch.cuda.is_available()
    device, full = torch.device("cuda" if cuda else "cpu"), cuda and not quick
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    # ms per step, CUDA events on a GPU, after warm-up steps (cuDNN autotuning, allocator)
    timed: dict[str, Any] = {"warmup": 3 if full else 1, "events": cuda}
    if full:
        batch, px, rounds, iters, cases = 256, 224, 3, 10, CASES
    else:  # the code path, not a measurement worth reading
        batch, px, rounds, iters = 2, 32, 2, 1
        cases = {"bf16": CASES["bf16"], "fp32": (None, False)}
    bench = BenchRun("throughput", results_dir)
    steps = {n: _step(device, amp, "resnet50", batch, px, cl) for n, (amp, cl) in cases.items()}
    times = interleaved_times(steps, reps=rounds, iters=iters, **timed)
    _add_rows(
        bench, times, "tf32" if "tf32" in times else "fp32", batch, "images_per_s",
        label=f"resnet50 batch {batch} {px}px", model="resnet50", device=device.type,
        batch=batch, image_size=px, rounds=rounds, iters_per_round=iters,
        anchor_images_per_s=ANCHOR_IMAGES_PER_S, anchor=ANCHOR,
    )  # fmt: skip
    # transformer_base tokens/s (transformer_tiny with quick), bf16 vs fp32 / TF32
    model = "transformer_tiny" if quick else "transformer_base"
    if full:
        batch, seq, rounds, iters = 128, 64, 3, 10
    elif quick:
        batch, seq, rounds, iters = 2, 8, 2, 1
    else:  # CPU: a real measurement of this machine, at a batch it runs in about a second
        batch, seq, rounds, iters = 8, 32, 3, 2
    base = "tf32" if cuda else "fp32"
    precisions = (("bf16", torch.bfloat16), (base, None))
    steps = {n: _step(device, amp, model, batch, seq) for n, amp in precisions}
    times = interleaved_times(steps, reps=rounds, iters=iters, **timed)
    _add_rows(
        bench, times, base, batch * 2 * seq, "tokens_per_s",
        label=f"{model} batch {batch} x {seq}+{seq} tokens", model=model,
        device=device.type, batch=batch, seq_len=seq, tokens_per_step=batch * 2 * seq,
        rounds=rounds, iters_per_round=iters,
    )  # fmt: skip
    path = bench.save()
    _plot(bench)
    return path


def _add_rows(
    bench: BenchRun, times: dict, base: str, per_step: int, rate: str, label: str, **fixed: Any
) -> None:
    """One row per case: median and fastest step, ``rate`` (``per_step`` items per second
    at the median step) and the speed-up over the ``base`` case of the same run; printed."""
    med = {n: statistics.median(t) for n, t in times.items()}
    for name, t in times.items():
        row = bench.add(
            case=name,
            **fixed,
            median_step_ms=med[name],
            min_step_ms=min(t),
            **{rate: per_step / med[name] * 1e3},
            speedup_vs_tf32=med[base] / med[name],
        )
        print(
            f"{label} {name:>18}: {row['median_step_ms']:9.2f} ms/step, "
            f"{row[rate]:9.0f} {rate.removesuffix('_per_s')}/s "
            f"(x{row['speedup_vs_tf32']:.2f} vs {base})",
            flush=True,
        )


def _plot(bench: BenchRun) -> None:
    df = bench.frame()
    images, tokens = df[df["model"] == "resnet50"], df[df["model"] != "resnet50"]
    panels = [p for p in (images, tokens) if len(p)]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(6.5 * len(panels), 1.9 + 0.5 * max(map(len, panels))),
        squeeze=False,
    )  # fmt: skip
    for ax, part in zip(axes[0], panels, strict=True):
        rate = "images_per_s" if part is images else "tokens_per_s"
        name = "ResNet-50" if part is images else str(part["model"].iloc[0])
        colour = BENCH_COLOURS["images" if part is images else "tokens"]
        ax.barh(part["case"], part[rate], color=colour)
        for i, r in enumerate(part.itertuples()):
            v = getattr(r, rate)
            ax.annotate(f"{v:,.0f}/s" if v >= 100 else f"{v:.3g}/s",
                        (v, i), xytext=(4, 0), textcoords="offset points", va="center",
                        fontsize=8, bbox={"fc": "white", "ec": "none", "pad": 1})  # fmt: skip
            ax.annotate(f" ({r.speedup_vs_tf32:.2f}x)", (v, i), xytext=(4, -11),
                        textcoords="offset points", va="center", fontsize=7,
                        bbox={"fc": "white", "ec": "none", "pad": 1})  # fmt: skip
        ax.set_xlim(0, 1.3 * float(part[rate].max()))
        if part is images:
            if (part["device"] == "cuda").any():
                ax.axvline(ANCHOR_IMAGES_PER_S, ls="--", color=BENCH_COLOURS["reference"],
                           label="NVIDIA ref., 1x A100")  # fmt: skip
                ax.legend(fontsize=7, loc="lower right")
            ax.set_xlabel("training images / s (synthetic data, median step)")
        else:
            ax.set_xlabel("source + target tokens / s (synthetic data, median step)")
        r0 = part.iloc[0]
        n = f"; n = {int(r0['rounds'])} rounds of {int(r0['iters_per_round'])} steps"
        ax.set_title(f"{name} training by precision (x: against fp32 / tf32{n})", fontsize=8)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"Training throughput on {bench.meta['hardware']}", fontsize=10)
    save_figure(fig, bench.png_path)


BENCHMARKS.register("throughput")(BenchmarkSpec(run=run, replot=_plot))
