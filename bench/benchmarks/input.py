"""Benchmark ``input``: images/s of the input pipeline per epoch, torch vs DALI, per cache.

Data: a generated ImageNet-like JPEG folder (:func:`bench.data.jpegs.cached_jpeg_folder`:
1,000 images of about 110 KB in 100 classes, made once under the temp directory; quick
mode: 64 tiny images).  For every loader (``torch``: the cache-backed torchvision
DataLoader with one worker process per core; ``dali``: DALI on the CPU with one thread per
core), every cache (none, disk, memory, multilevel, predecoded) and level 0 with
and without the slow-storage emulator (50 MB/s and 5 ms per file), a fresh loader and an
empty cache directory read 3 epochs of training batches (random-resized crop to 224,
flip, normalise; batch 32) and nothing else: epoch 1 is cold, epochs 2 and 3 show the
cache.  A tiny unrecorded run per loader first takes DALI's and the worker
server's one-time start-up out of the timings.

Rows (one per case and epoch): ``loader, cache, throttled, epoch, images, epoch_s,
images_per_s, median_ms`` (median time per *batch*, ms), the cache counters of the
epoch (``hits, misses, mb_l0``), and two ratios taken in the same run:
``speedup_vs_none`` (images/s over the same loader's ``cache=none`` in the same epoch and
throttle setting) and ``dali_vs_torch`` (DALI's images/s over torch's, same case).
Targets (issue 5): throttled, epochs 2-3, multilevel >= 5x none; DALI CPU >= torch.
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.benchmarks import BENCHMARKS
from bench.benchmarks.harness import BenchRun, latest_run

CACHES = ("none", "disk", "memory", "multilevel", "predecoded")
THROTTLE = (50.0, 5.0)  # MB/s, ms per file
IMAGES = 1000  # ~110 MB of JPEGs: 20 cases x 3 epochs fit in about 10 minutes on 2 cores


def _epochs(loader_kind: str, cache: str, throttled: bool, root: str, epochs: int,
            quick: bool, size: int | None = None) -> list[dict[str, Any]]:
    import torch

    from bench.data.config import CacheConfig, DataConfig
    from bench.data.folder_input import build_folder

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2
    workers = 0 if quick else cores
    size = size or (32 if quick else 224)
    cache_dir = tempfile.mkdtemp(prefix="tkb-input-cache-")
    try:
        d = DataConfig(
            name="imagefolder", root=root, batch_size=8 if quick else 32, eval_batch_size=32,
            image_size=size, eval_image_size=size, num_classes=0, num_workers=workers,
            loader=loader_kind, flip=True, dali_threads=cores, prefetch=2,
            throttle_mbps=THROTTLE[0] if throttled else 0.0,
            throttle_ms=THROTTLE[1] if throttled else 0.0,
        )
        c = CacheConfig(name=cache, dir=cache_dir, disk_gb=10.0, memory_gb=4.0)
        bundle = build_data_quiet(build_folder, d, c)
        rows = []
        for epoch in range(epochs):
            loader = bundle.train
            loader.set_epoch(epoch)
            n, gaps = 0, []
            t0 = t_last = time.perf_counter()
            for x, _ in loader:
                now = time.perf_counter()
                gaps.append((now - t_last) * 1e3)
                t_last = now
                n += x.shape[0]
            dt = time.perf_counter() - t0
            st = loader.epoch_stats()
            rows.append(dict(
                loader=loader_kind, cache=cache, throttled=throttled, epoch=epoch + 1, images=n,
                epoch_s=round(dt, 3), images_per_s=round(n / dt, 1),
                median_ms=round(statistics.median(gaps), 2) if gaps else float("nan"),
                hits=int(st.get("cache/hits", 0)), misses=int(st.get("cache/misses", 0)),
                mb_l0=round(st.get("cache/bytes_l0", 0) / 1e6, 1),
                workers=workers if loader_kind == "torch" else cores, image_size=size,
            ))
            print(f"  {loader_kind:5s} {cache:10s} throttled={throttled!s:5s} epoch {epoch + 1}: "
                  f"{n / dt:7.1f} images/s", flush=True)
        # stop this case's workers and threads before the next case is timed
        for ld in (bundle.train, bundle.eval):
            ld.close()
        del bundle, loader
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return rows
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def build_data_quiet(build_folder, d, c):
    import torch

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return build_folder(d, c, 0, 1, dev, 0)


def _ratios(rows: list[dict[str, Any]]) -> None:
    by = {(r["loader"], r["cache"], r["throttled"], r["epoch"]): r["images_per_s"] for r in rows}
    for r in rows:
        none = by.get((r["loader"], "none", r["throttled"], r["epoch"]))
        r["speedup_vs_none"] = round(r["images_per_s"] / none, 3) if none else float("nan")
        torch_ = by.get(("torch", r["cache"], r["throttled"], r["epoch"]))
        r["dali_vs_torch"] = (round(r["images_per_s"] / torch_, 3)
                              if r["loader"] == "dali" and torch_ else float("nan"))


def _plot(csv: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.results.plots import save_figure

    df = latest_run(csv)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, throttled in zip(axes, (True, False), strict=True):
        sub = df[df["throttled"] == throttled]
        for (loader, cache), g in sub.groupby(["loader", "cache"], sort=False):
            ax.plot(g["epoch"], g["images_per_s"], marker="o",
                    linestyle="-" if loader == "dali" else "--", label=f"{loader} / {cache}")
        ax.set_title("level 0 throttled: 50 MB/s, 5 ms per file" if throttled else "level 0 unthrottled")
        ax.set_xlabel("epoch")
        ax.set_xticks(sorted(df["epoch"].unique()))
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("training images / s (log)")
    axes[1].legend(fontsize=7, ncol=2)
    n = int(df["images"].max())
    fig.suptitle(f"Input pipeline, {n} generated JPEGs, RRC 224 + flip: {df['hardware'].iloc[0]}", fontsize=9)
    save_figure(fig, png)


@BENCHMARKS.register("input")
def run(results_dir: str = "results", quick: bool = False) -> Path:
    """Measure every (loader, cache, throttle) case for 3 epochs; CSV + PNG; returns the CSV."""
    from bench.data.jpegs import cached_jpeg_folder

    try:
        import nvidia.dali  # noqa: F401

        loaders = ("torch", "dali")
    except ImportError:
        print("NVIDIA DALI is not installed: measuring the torch loader only")
        loaders = ("torch",)
    if quick:
        root = cached_jpeg_folder(64, 4, val_images=8, small=True)
        caches, epochs = ("none", "multilevel", "predecoded"), 2
    else:
        t0 = time.perf_counter()
        root = cached_jpeg_folder(IMAGES, 100, val_images=100, target_kb=110.0)
        print(f"JPEG folder {root} ready in {time.perf_counter() - t0:.0f} s")
        caches, epochs = CACHES, 3
    # warm-up, not recorded: DALI's one-time library start-up and the DataLoader's
    # forkserver (which imports torch once) would otherwise land in the first case's epoch 1
    tiny = cached_jpeg_folder(128, 2, val_images=4, small=True)  # a few batches per worker
    for loader in loaders:
        _epochs(loader, "none", False, tiny, 1, quick, size=32)
    bench = BenchRun("input", results_dir)
    rows: list[dict[str, Any]] = []
    for throttled in (True, False):
        for loader in loaders:
            for cache in caches:
                rows += _epochs(loader, cache, throttled, root, epochs, quick)
    _ratios(rows)
    for r in rows:
        bench.add(**r)
    path = bench.save()
    _plot(path, bench.png_path)
    return path
