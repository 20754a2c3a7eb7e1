"""Benchmark ``update``: one optimizer step per optimizer and update mode over ResNet-50's and
Transformer-base's parameters (gradients as DDP bucket views), interleaved with a
streaming-bandwidth probe for the memory floor (Shi et al., MLSys 2021, section 4); columns
and protocol: docs/internals/benchmarks.md (update)."""

from __future__ import annotations

import copy
import gc
import os
import statistics
import warnings
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import torch
from matplotlib.patches import Patch
from matplotlib.patheffects import withStroke

from bench.benchmarks import BENCHMARKS, BenchmarkSpec
from bench.benchmarks.harness import BenchRun, fmt
from bench.benchmarks.timing import interleaved_times, summarize
from bench.models import build_model
from bench.models.config import ModelConfig
from bench.optim import OPTIMIZERS as SPECS
from bench.optim import build_optimizer
from bench.optim.config import OptimConfig
from bench.optim.layout import ddp_like_buckets
from bench.results.plots import BENCH_COLOURS, UPDATE_COLOURS, save_figure

# bytes read + written per parameter value by an ideal update, per fp32 value
TRAFFIC_VALUES = {"sgd": 5, "lars": 7, "adamw": 7}
OPTIMIZERS = {
    "sgd": dict(name="sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4),
    "lars": dict(name="lars", lr=1.0, momentum=0.9, nesterov=False, weight_decay=5e-4),
    "adamw": dict(name="adamw", lr=1e-3, weight_decay=0.05),
}


def _build(
    model: torch.nn.Module, opt: str, mode: str, variant: str, device: torch.device
) -> tuple:
    m = copy.deepcopy(model).to(device)
    cfg = SimpleNamespace(**{**OptimConfig().__dict__, **OPTIMIZERS[opt], "update": mode})
    if variant.startswith("master="):
        cfg.master_weights = variant.split("=")[1]
    optimizer = build_optimizer(m, cfg)
    ddp_like_buckets(list(m.parameters()))  # p.grad: views into DDP-like buckets
    gen = torch.Generator(device=device).manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            g = torch.randn(p.shape, generator=gen, device=device).mul_(1e-2).to(p.dtype)
            p.grad.copy_(g)
    return m, optimizer


def _copies(optimizer: Any) -> int:
    """Gradient tensors the optimizer copied so far (torch's modes copy none)."""
    return sum(b.copies for b in getattr(optimizer, "buckets", []))


MODE_NAMES = {
    "naive": "naive (a per-tensor loop)",
    "foreach": "foreach (torch's)",
    "fused": "fused (torch's)",
    "flat": "flat (this project's)",
}


def _plot(bench: BenchRun) -> None:
    df = bench.frame()
    df["variant"] = df["variant"].fillna("")  # an empty variant reads back from the CSV as NaN
    models = list(dict.fromkeys(df["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(6.5 * len(models), 5.2), squeeze=False)
    below_any = False
    for ax, model in zip(axes[0], models, strict=True):
        sub = df[df["model"] == model]
        labels = [
            f"{r.optimizer} {r.mode}{' ' + r.variant if r.variant else ''}"
            for r in sub.itertuples()
        ]
        x = list(range(len(sub)))
        below = (sub["median_ms"] < sub["floor_ms"]).to_numpy()
        below_any |= bool(below.any())
        ax.bar(
            x,
            sub["median_ms"],
            yerr=sub["iqr_ms"].to_numpy(dtype=float) / 2,
            capsize=2,
            error_kw={"lw": 0.8},
            color=[UPDATE_COLOURS.get(m, UPDATE_COLOURS["other"]) for m in sub["mode"]],
            edgecolor="k",
            lw=0.5,
            hatch=["xx" if b else "" for b in below],
        )
        halo = [withStroke(linewidth=3.5, foreground="white")]  # seen on a dark bar too
        ax.scatter(x, sub["floor_ms"], marker="_", s=300, color=BENCH_COLOURS["reference"],
                   zorder=3, path_effects=halo)  # fmt: skip
        ax.set_xticks(x, labels, rotation=90, fontsize=7)
        ax.set(ylim=(0, None), ylabel="time per optimizer step (ms, median)")
        ax.grid(axis="y", alpha=0.3)
        n, v = int(sub["n_tensors"].iloc[0]), sub["n_values"].iloc[0] / 1e6
        reps = f"n = {int(sub['reps'].median())} timed steps a bar"
        ax.set_title(f"{model}: {n} tensors, {v:.1f} M values; {reps}", fontsize=8)
    modes = list(dict.fromkeys(df["mode"]))
    handles = [
        Patch(facecolor=UPDATE_COLOURS.get(m, UPDATE_COLOURS["other"]), edgecolor="k", lw=0.5,
              label=MODE_NAMES.get(m, m))
        for m in modes
    ]  # fmt: skip
    handles.append(
        plt.Line2D([], [], color=BENCH_COLOURS["reference"], marker="_", ls="", ms=14,
                   label="memory-traffic floor (ideal bytes / bandwidth probed in this run)")
    )  # fmt: skip
    if below_any:
        handles.append(
            Patch(facecolor="white", edgecolor="k", hatch="xx", lw=0.5,
                  label="below the floor: the update beat the probe's bandwidth (caches)")
        )  # fmt: skip
    handles.append(plt.Line2D([], [], color="k", lw=0.8, label="error bar: inter-quartile range"))
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=7, frameon=False)
    load = f", load average {df['loadavg_1m'].mean():.1f}"
    fig.suptitle(f"Optimizer update time by mode -- {bench.meta['hardware']}{load}", fontsize=9)
    fig.tight_layout(rect=(0, 0.75 / fig.get_figheight(), 1, 1))
    save_figure(fig, bench.png_path, layout=False)


def run(results_dir: str = "results", quick: bool = False) -> Path:
    """Measure every (parameter set, optimizer, mode); append rows to results/bench/update.csv."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    run = BenchRun("update", results_dir)
    reps, warmup = (3, 1) if quick else (9, 2)
    if device.type == "cuda" and not quick:
        reps, warmup = 21, 3  # cheap there: a step takes milliseconds
    models = ("resnet18_head", "transformer_tiny") if quick else ("resnet50", "transformer_base")
    # deferred: torchvision is slow to load, and only this path needs it
    import torchvision

    # nn.Transformer warns about nested tensors, irrelevant here: no forward is ever run
    warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
    for model_name in models:
        torch.manual_seed(0)  # a module holding the parameter set
        if model_name == "resnet50":
            model = torchvision.models.resnet50()
        elif model_name == "resnet18_head":  # quick: ResNet-18's first 30 tensors
            m = torchvision.models.resnet18()
            model = torch.nn.Sequential(m.conv1, m.bn1, m.layer1, m.layer2)
        else:  # the registry's Transformers
            vocab = 37000 if model_name == "transformer_base" else 1000
            model = build_model(ModelConfig(name=model_name), vocab)
        params = list(model.parameters())
        n_values = sum(p.numel() for p in params)
        for opt in OPTIMIZERS:
            # its modes, then flat with a bf16 model copy over fp32 master weights
            cases = [(m, "") for m in SPECS.get(opt).mode_names()]
            built = {k: _build(model, opt, *k, device) for k in [*cases, ("flat", "master=bf16")]}
            # streaming-bandwidth probes as large as the parameter set, timed among the cases:
            # a copy (8 B a value) and an in-place add (12 B a value); the floor uses the faster
            src, acc = torch.randn(n_values, device=device), torch.randn(n_values, device=device)
            dst = torch.empty_like(src)
            probes = {"_copy": partial(dst.copy_, src), "_rmw": partial(acc.add_, src, alpha=1e-9)}
            copies0 = {k: _copies(o) for k, (_, o) in built.items()}
            # CUDA events: the device's time, not the host's
            timed = {"reps": reps, "shuffle": True, "events": device.type == "cuda"}
            steps = {k: o.step for k, (_, o) in built.items()}
            steps = interleaved_times({**steps, **probes}, warmup=warmup, **timed)
            copy_ms = statistics.median(steps["_copy"])  # one copy of the parameter set
            copy_gbps = 8 * n_values / copy_ms / 1e6
            rmw_gbps = 12 * n_values / statistics.median(steps["_rmw"]) / 1e6
            n_steps = warmup + reps
            ddp_copies = {k: (_copies(o) - copies0[k]) / n_steps for k, (_, o) in built.items()}
            bw = max(copy_gbps, rmw_gbps) * 1e9
            del probes, src, dst, acc, steps["_copy"], steps["_rmw"]
            zero = {k: (lambda o=o: o.zero_grad(set_to_none=False)) for k, (_, o) in built.items()}
            zeros = interleaved_times(zero, warmup=1, **timed)
            floor_ms = TRAFFIC_VALUES[opt] * 4 * n_values / bw * 1e3
            med = {k: statistics.median(t) for k, t in steps.items()}
            # a copied gradient costs its share of a copy of the parameter set
            copy_cost = {k: ddp_copies[k] / len(params) * copy_ms for k in med}
            total = {k: med[k] + copy_cost[k] for k in med}
            fused, naive, foreach = ("fused", ""), ("naive", ""), ("foreach", "")
            for (mode, variant), t in steps.items():
                k = (mode, variant)
                row: dict[str, Any] = dict(model=model_name, optimizer=opt, mode=mode)
                row.update(variant=variant, device=device.type, threads=torch.get_num_threads())
                row["loadavg_1m"] = os.getloadavg()[0]  # a shared machine's load
                row.update(n_tensors=len(params), n_values=n_values, **summarize(t))
                row["zero_grad_ms"] = statistics.median(zeros[k])
                row["bytes_per_step"] = TRAFFIC_VALUES[opt] * 4 * n_values
                row.update(copy_gbps=copy_gbps, rmw_gbps=rmw_gbps, floor_ms=floor_ms)
                row.update(floor_ratio=med[k] / floor_ms, copy_ms=copy_ms, ddp_copies=ddp_copies[k])
                row.update(ddp_copy_ms=copy_cost[k], total_ms=total[k])
                row["total_vs_fused"] = total[k] / total[fused] if fused in total else None
                row["speedup_vs_naive"] = med[naive] / med[k]
                row["speedup_vs_fused"] = med[fused] / med[k] if fused in med else None
                row["speedup_vs_foreach"] = med[foreach] / med[k]
                run.add(**row)
                print(
                    f"{model_name:>16} {opt:>6} {mode:>8} {variant:>22} {row['median_ms']:9.2f} ms "
                    f"(+copies {row['ddp_copy_ms']:.2f} ms; floor {floor_ms:7.2f} ms, "
                    f"x{row['floor_ratio']:.2f}; "
                    f"vs naive x{row['speedup_vs_naive']:.2f})",
                    flush=True,
                )
            del built
            gc.collect()
    path = run.save()
    _plot(run)
    return path


def headline(rows: pd.DataFrame) -> list[str]:
    """Per model and optimizer: the flat update against the strongest baseline of the same
    run first (torch's fused update, else foreach), the per-tensor Python loop after."""
    need = {"model", "optimizer", "mode", "median_ms"}
    if not need <= set(rows.columns):
        return []
    rows = rows.assign(variant=rows.get("variant", pd.Series("", index=rows.index)).fillna(""))
    out = []
    for (model, opt), g in rows[rows["variant"] == ""].groupby(["model", "optimizer"], sort=False):
        ms = {m: float(x["median_ms"].median()) for m, x in g.groupby("mode")}
        strong = next((b for b in ("fused", "foreach") if b in ms), None)
        if "flat" not in ms or strong is None:
            continue
        line = (
            f"{model} {opt}: flat {fmt(ms['flat'], ' ms')} vs torch {strong} "
            f"{fmt(ms[strong], ' ms')} ({ms[strong] / ms['flat']:.2f}x)"
        )
        if "naive" in ms:
            line += (
                f"; vs the per-tensor loop {fmt(ms['naive'], ' ms')} "
                f"({ms['naive'] / ms['flat']:.2f}x)"
            )
        out.append(line)
    return out


BENCHMARKS.register("update")(BenchmarkSpec(run=run, replot=_plot, headline=headline))
