"""``bench comm``: every method's aggregation per step of ResNet-50's and Transformer-base's
DDP buckets on four local gloo workers as 2 nodes x 2, and rows ``kind=overlap`` from
:mod:`.overlap`; columns and protocol: docs/internals/benchmarks.md (comm)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch

from bench import methods
from bench.benchmarks import BENCHMARKS, BenchmarkSpec
from bench.benchmarks.buckets import FakeBucket
from bench.benchmarks.harness import BenchRun
from bench.benchmarks.overlap import overlap_worker
from bench.benchmarks.spawn import run_workers
from bench.benchmarks.timing import interleaved_times
from bench.cluster import projection
from bench.comm import is_sparse, make_hook
from bench.results.plots import BENCH_COLOURS, save_figure

METHODS = [s.name for s in methods.specs() if s.benched]
WHOLE = [m for m in METHODS if not methods.get(m).sparse]  # the baseline first
SPARSE = [m for m in METHODS if methods.get(m).sparse]  # flat first, hierarchical last
MODELS = ["resnet50", "transformer_base"]
DENSITIES = [0.001, 0.01]


def model_buckets(
    model: str = "resnet50", bucket_cap_mb: float = 25.0, vocab: int = 32000
) -> list[list[torch.Size]]:
    """Parameter shapes per DDP bucket (DDP's initial assignment, as the projection's) of
    ResNet-50 or of ``transformer_base`` with a joint vocabulary of ``vocab`` tokens."""
    _, shapes = projection.model_buckets(model, bucket_cap_mb, vocab)
    return [[torch.Size(s) for s in b] for b in shapes]


def _worker(
    rank: int,
    world: int,
    shapes: list[list[torch.Size]],
    cases: list[tuple[str, float]],
    warmup: int,
    reps: int,
) -> list[dict[str, Any]]:
    buckets = [
        FakeBucket(i, s, i == len(shapes) - 1, seed=100 * rank + i) for i, s in enumerate(shapes)
    ]
    timed: dict[str, Any] = dict(
        slowest_rank=True, setup={0: lambda: [b.refill() for b in buckets]}
    )
    rows = []
    for name, density in cases:
        state, hook = make_hook(name, density=density, powersgd_rank=4)
        step = {0: lambda h=hook, s=state: torch.futures.wait_all([h(s, b) for b in buckets])}
        interleaved_times(step, warmup=warmup, reps=0, **timed)
        state.stats.pop()  # count only the timed steps
        t = interleaved_times(step, warmup=0, reps=reps, **timed)[0]  # the slowest worker's
        st = state.stats.pop()
        row = {"method": name, "density": density if is_sparse(name) else 1.0}
        row.update(median_ms=statistics.median(t), min_ms=min(t))
        row.update(bytes_per_worker=st["comm/bytes_per_step"])
        row.update(inter_node_bytes_per_worker=st["comm/inter_node_bytes_per_step"])
        row.update(sent_density=st["comm/density"], select_ms=st["time/select_s"] * 1e3)
        rows.append({**row, "comm_ms": st["time/comm_s"] * 1e3})
    return rows


def _link_bytes(method: str, density: float, shapes: list, n: int, m: int) -> float:
    """Bytes per step leaving each node over its link (bench.comm.cost)."""
    numels = [sum(int(torch.Size(s).numel()) for s in b) for b in shapes]
    spec = methods.get(method)
    return spec.traffic(numels, n, m, spec.knobs_of({"comm.density": density}), shapes).link_bytes


def run(results_dir: str = "results", quick: bool = False) -> Path:
    world, ppn = 4, 2
    if quick:  # two small buckets: seconds
        models = {"tiny": [[torch.Size([64, 300]), torch.Size([64])], [torch.Size([128, 256])]]}
        cases = [(m, 1.0) for m in WHOLE[:2]] + [(m, 0.01) for m in (SPARSE[0], SPARSE[-1])]
        warmup, reps = 1, 2
    else:
        models = {m: model_buckets(m) for m in MODELS}
        cases = [(m, 1.0) for m in WHOLE] + [(m, d) for d in DENSITIES for m in SPARSE]
        warmup, reps = 3, 5  # powersgd compresses from its 3rd step on
    bench = BenchRun("comm", results_dir)
    at = {"world_size": world, "nnodes": world // ppn, "procs_per_node": ppn}
    for model, shapes in models.items():
        # 4 workers share the cores: one thread each
        rows = run_workers(_worker, world, ppn, shapes, cases, warmup, reps, timeout_s=1800)[0]
        dense = next(r for r in rows if r["method"] == WHOLE[0])
        numel = sum(int(torch.Size(s).numel()) for b in shapes for s in b)
        dense_inter = _link_bytes(WHOLE[0], 1.0, shapes, world // ppn, ppn)
        for r in rows:
            inter = _link_bytes(r["method"], r["density"], shapes, world // ppn, ppn)
            row = {"kind": "aggregation", "model": model, **r, "link_bytes_per_node": inter}
            row.update(**at, buckets=len(shapes), numel=numel, reps=reps)
            row["speedup_vs_dense"] = dense["median_ms"] / r["median_ms"]
            row["bytes_ratio_vs_dense"] = dense["bytes_per_worker"] / r["bytes_per_worker"]
            row["inter_bytes_ratio_vs_dense"] = dense_inter / inter if inter else float("inf")
            bench.add(**row)
            print(
                f"{model:>16} {r['method']:>9} d={r['density']:<6} {r['median_ms']:9.1f} ms/step  "
                f"{r['bytes_per_worker'] / 1e6:9.3f} MB/worker  "
                f"{inter / 1e6:9.3f} MB over each node's link  "
                f"(dense/this {dense_inter / max(inter, 1):.0f}x)",
                flush=True,
            )
    # rows kind=overlap: a real ResNet-18 step with each hook, beside its backward pass alone
    # and its communication alone (bench.benchmarks.overlap)
    which = [WHOLE[0], SPARSE[-1]] if quick else METHODS
    case = (
        (0.01, 2, 16, 1, 1) if quick else (0.01, 32, 64, 3, 4)
    )  # density, batch, image, warmup, reps
    for r in run_workers(overlap_worker, world, ppn, which, *case, timeout_s=1800)[0]:
        bench.add(**r, median_ms=r["step_ms"], **at)
        print(
            f"overlap {r['method']:>9}: step {r['step_ms']:7.1f} ms, backward alone "
            f"{r['backward_ms']:7.1f}, exposed {r['exposed_ms']:7.1f} = "
            f"{r['exposed_ratio']:.2f} x the communication alone ({r['comm_alone_ms']:.1f})",
            flush=True,
        )
    path = bench.save()
    _plot(bench)
    return path


def _plot(bench: BenchRun) -> None:
    """``comm.png`` (per model: time per step, bytes per worker) and ``comm.overlap.png``."""
    df = bench.frame()
    ov, df = df[df["kind"] == "overlap"], df[df["kind"] != "overlap"]
    models = list(dict.fromkeys(str(m) for m in df["model"]))
    most = max(int((df["model"] == m).sum()) for m in models)
    fig, axes = plt.subplots(
        2, len(models), figsize=(6.2 * len(models), 2.2 + 0.5 * most), squeeze=False
    )
    reps = f"median of n = {int(df['reps'].median())} steps"
    for col, model in enumerate(models):
        d = df[df["model"] == model]
        y = np.arange(len(d))
        labels = [
            f"{m} d={dd:g}" if is_sparse(m) else str(m)
            for m, dd in zip(d["method"], d["density"], strict=True)
        ]
        a1, a2 = axes[0][col], axes[1][col]
        a1.barh(y, d["median_ms"], color=[methods.colour(m) for m in d["method"]])
        a1.set_xlabel(f"time per step, all buckets (ms, {reps})")
        a1.set_title(f"{model}: how long one step's aggregation takes", fontsize=9)
        a2.barh(y - 0.2, d["bytes_per_worker"] / 1e6, 0.4, color=BENCH_COLOURS["total"],
                label="total")  # fmt: skip
        a2.barh(y + 0.2, d["inter_node_bytes_per_worker"] / 1e6, 0.4,
                color=BENCH_COLOURS["inter-node"], edgecolor="k", lw=0.4,
                label="inter-node (each node's link)")  # fmt: skip
        a2.set(xscale="log", xlabel="MB sent per worker per step (log)")
        a2.set_title(f"{model}: how much each worker sends", fontsize=9)
        for ax in (a1, a2):
            ax.set_yticks(y, labels, fontsize=8)
            for t, m in zip(ax.get_yticklabels(), d["method"], strict=True):
                t.set_color(methods.colour(m))
            ax.invert_yaxis()
            ax.grid(True, axis="x", which="both", alpha=0.3)
    h, lab = axes[1][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(
        f"{' and '.join(models)} gradient aggregation, {int(df['world_size'].iloc[0])} gloo "
        f"workers as {int(df['nnodes'].iloc[0])} nodes x {int(df['procs_per_node'].iloc[0])}, "
        f"on {bench.meta['hardware']}",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.35 / fig.get_figheight(), 1, 1))
    save_figure(fig, bench.png_path, layout=False)
    if ov.empty:
        return
    # communication alone beside the part of it the step exposes (ResNet-18 step)
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    x, c = np.arange(len(ov)), BENCH_COLOURS
    ax.bar(x - 0.2, ov["comm_alone_ms"], 0.4, color=c["alone"], label="communication alone")
    ax.bar(x + 0.2, ov["exposed_ms"].clip(lower=0), 0.4, color=c["exposed"],
           label="exposed in the step (step - backward alone)")  # fmt: skip
    for i, (r, top) in enumerate(zip(ov["exposed_ratio"], ov["exposed_ms"], strict=True)):
        ax.annotate(f"{r:.2f}x", (i + 0.2, max(top, 0)), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, list(ov["method"]))
    for t, m in zip(ax.get_xticklabels(), ov["method"], strict=True):
        t.set_color(methods.colour(m))
    most = float(ov[["comm_alone_ms", "exposed_ms"]].max().max())
    ax.set(ylabel="ms per step (median)", ylim=(0, 1.18 * most))
    b = ov.iloc[0]
    ax.set_title(
        f"ResNet-18 step (batch {int(b['batch'])}, {int(b['image'])} px), backward alone "
        f"{ov['backward_ms'].median():.0f} ms; number: exposed / alone",
        fontsize=8,
    )
    ax.legend(fontsize=7, loc="upper left", ncol=2, frameon=False)
    fig.suptitle(f"How much of the communication a training step exposes\n"
                 f"{bench.meta['hardware']}", fontsize=9)  # fmt: skip
    save_figure(fig, bench.png_path.with_suffix(".overlap.png"))


BENCHMARKS.register("comm")(BenchmarkSpec(run=run, replot=_plot))
