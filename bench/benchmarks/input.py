"""Benchmark ``input``: images/s of every loader and cache per epoch, level 0 throttled and
not, 3 epochs from cold, like for like; columns and protocol: docs/internals/benchmarks.md."""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import torch

from bench.benchmarks import BENCHMARKS, BenchmarkSpec
from bench.benchmarks.harness import BenchRun, have_dali, latest_run, usable_cores
from bench.data.cached_folder import build_folder
from bench.data.config import CacheConfig, DataConfig
from bench.data.jpegs import cached_jpeg_folder
from bench.data.storage import drop_page_cache, resident_fraction
from bench.results.plots import CACHE_COLOURS, save_figure

CACHES = ("none", "disk", "memory", "multilevel", "predecoded")
THROTTLE = (50.0, 5.0)  # MB/s, ms per file
IMAGES = 1024  # ~113 MB of JPEGs; a multiple of 4 parts x 32 images: no case drops any
OUT = 224  # training crop (pixels)


def _config(
    loader: str, cache: str, throttled: bool, root: str, quick: bool, size: int, cache_dir: str
):
    """DataConfig and CacheConfig of one case: ``2 x cores`` reads outstanding in both loaders."""
    cores = 1 if quick else usable_cores()  # DALI fetches through 2 x its threads
    d = DataConfig(
        name="imagefolder",
        root=root,
        batch_size=8 if quick else 32,
        eval_batch_size=32,
        image_size=size,
        eval_image_size=size,
        num_classes=0,
        num_workers=2 * cores,
        loader=loader,
        flip=True,
        dali_threads=cores,
        prefetch=2,
        throttle_mbps=THROTTLE[0] if throttled else 0.0,
        throttle_ms=THROTTLE[1] if throttled else 0.0,
    )
    c = CacheConfig(name=cache, dir=cache_dir, disk_gb=10.0, memory_gb=4.0, predecode_size=0)
    return d, c


def _epochs(
    loader_kind: str,
    cache: str,
    throttled: bool,
    root: str,
    epochs: int,
    quick: bool,
    size: int | None = None,
) -> list[dict[str, Any]]:
    size = size or (32 if quick else OUT)
    cache_dir = tempfile.mkdtemp(prefix="tkb-input-cache-")
    try:
        d, c = _config(loader_kind, cache, throttled, root, quick, size, cache_dir)
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        bundle = build_folder(d, c, 0, 1, dev, 0)
        loader = bundle.train
        # worker processes, threads and the most storage reads in flight (DALI: the threads
        # fetching ahead of the external source)
        reads = max(1, d.num_workers)
        conc = dict(processes=d.num_workers, threads=reads, reads_outstanding=reads)
        if d.loader != "torch":
            reads = loader.fetch_threads
            conc = dict(processes=0, threads=d.dali_threads, reads_outstanding=reads)
        rows = []
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            cold = [os.path.join(root, d.train_dir), cache_dir]
            drop_page_cache(cold)
            try:  # the share (%) still resident after the drop
                resident = round(100 * resident_fraction(cold), 1)
            except OSError:  # no mincore here
                resident = float("nan")
            load = round(os.getloadavg()[0], 2)
            n, gaps = 0, []  # images, and ms between batches
            t0 = t_last = time.perf_counter()
            for batch, _ in loader:
                now = time.perf_counter()
                gaps.append((now - t_last) * 1e3)
                n, t_last = n + batch.shape[0], now
            dt = time.perf_counter() - t0
            st = loader.epoch_stats()
            row = dict(loader=loader_kind, cache=cache, throttled=throttled, epoch=epoch + 1)
            row.update(images=n, epoch_s=round(dt, 3), images_per_s=round(n / dt, 1))
            row["median_ms"] = round(statistics.median(gaps), 2) if gaps else float("nan")
            row.update(hits=int(st.get("cache/hits", 0)), misses=int(st.get("cache/misses", 0)))
            row["mb_l0"] = round(st.get("cache/bytes_l0", 0) / 1e6, 1)
            row["mb_decoded"] = round(st.get("cache/bytes_decoded", 0) / 1e6, 1)
            rows.append(
                {**row, **conc, "resident_pct": resident, "load_1m": load, "image_size": size}
            )
            print(
                f"  {loader_kind:5s} {cache:10s} throttled={throttled!s:5s} epoch {epoch + 1}: "
                f"{n / dt:7.1f} images/s  (load {load})",
                flush=True,
            )
        # stop this case's workers and threads before the next case is timed
        for ld in (bundle.train, bundle.eval):
            ld.close()
        del bundle, loader
        gc.collect()
        return rows
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def upsampled_share(sizes: list[tuple[int, int]], out: int = OUT, draws: int = 20) -> float:
    """Share of RandomResizedCrop(out) crops (scale 0.08-1, ratio 3/4-4/3) of images of these
    (width, height) that have fewer than ``out`` pixels on a side, so are enlarged."""
    # deferred: torchvision is slow to load, and only this path needs it
    from torchvision.transforms import RandomResizedCrop

    torch.manual_seed(0)
    up = 0
    for w, h in sizes:
        img = torch.empty(1, 1, 1).expand(3, h, w)  # only the shape is read
        for _ in range(draws):
            _, _, ch, cw = RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
            up += cw < out or ch < out
    return up / max(1, len(sizes) * draws)


def _plot(bench: BenchRun) -> None:
    df = latest_run(bench.csv_path)
    fig, axes = plt.subplots(1, 2, figsize=(13.5, 4.5), sharey=True)
    for ax, throttled in zip(axes, (True, False), strict=True):
        sub = df[df["throttled"] == throttled]
        for (loader, cache), g in sub.groupby(["loader", "cache"], sort=False):
            ax.plot(
                g["epoch"],
                g["images_per_s"],
                marker="o",
                linestyle="-" if loader == "dali" else "--",
                color=CACHE_COLOURS.get(cache, CACHE_COLOURS["other"]),
                label=f"{loader} / {cache}",
            )
        ax.set_title(
            "level 0 throttled: 50 MB/s per node, 5 ms per file"
            if throttled
            else "level 0 unthrottled (page cache dropped)"
        )
        ax.set(xlabel="epoch", xticks=sorted(df["epoch"].unique()), yscale="log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("training images / s (log)")
    # one legend beside the panels: it covers no line (solid / dashed: the loader)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    n = int(df["images"].max())
    reads = int(df["reads_outstanding"].max())
    fig.suptitle(
        f"Input pipeline, {n} generated JPEGs per epoch, RRC {OUT} + flip, <= {reads} reads "
        f"outstanding: {df['hardware'].iloc[0]}",
        fontsize=9,
    )
    save_figure(fig, bench.png_path)


def run(results_dir: str = "results", quick: bool = False) -> Path:
    """Measure every (loader, cache, throttle) case for 3 epochs; CSV + PNG; returns the CSV."""
    loaders: tuple[str, ...] = ("torch", "dali") if have_dali() else ("torch",)
    if not have_dali():
        print("NVIDIA DALI is not installed: measuring the torch loader only")
    caches, epochs = (("none", "multilevel", "predecoded"), 2) if quick else (CACHES, 3)
    if quick:
        root = cached_jpeg_folder(64, 4, val_images=8, small=True)
    else:
        t0 = time.perf_counter()
        root = cached_jpeg_folder(IMAGES, 100, val_images=100, target_kb=110.0)
        print(f"JPEG folder {root} ready in {time.perf_counter() - t0:.0f} s")
        # what pre-decoding at the original resolution costs, and what a 256 cap would do
        from PIL import Image  # deferred: Pillow only where images are decoded

        files = sorted((Path(root) / "train").rglob("*.jpg"))
        sizes = [Image.open(f).size for f in files]
        at256 = [(round(w * 256 / min(w, h)), round(h * 256 / min(w, h))) for w, h in sizes]
        jpeg_mb = sum(f.stat().st_size for f in files) / 1e6
        pixels_mb = sum(3 * w * h for w, h in sizes) / 1e6
        print(
            f"pre-decoded at the original resolution: {pixels_mb:.0f} MB of pixels for "
            f"{len(files)} images ({pixels_mb / jpeg_mb:.1f}x the {jpeg_mb:.0f} MB of JPEGs); "
            f"RRC {OUT} crops enlarged: {100 * upsampled_share(sizes, draws=5):.0f} % "
            f"(at shorter side 256 it would be {100 * upsampled_share(at256, draws=5):.0f} %)",
            flush=True,
        )
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
    if len({r["images"] for r in rows}) > 1:
        print("WARNING: the cases read different numbers of images per epoch", flush=True)
    by = {(r["loader"], r["cache"], r["throttled"], r["epoch"]): r["images_per_s"] for r in rows}
    for r in rows:  # against no cache and against the torch loader, in the same epoch
        none = by.get((r["loader"], "none", r["throttled"], r["epoch"]))
        r["speedup_vs_none"] = round(r["images_per_s"] / none, 3) if none else float("nan")
        tl = by.get(("torch", r["cache"], r["throttled"], r["epoch"]))
        dali = r["loader"] == "dali" and tl
        r["dali_vs_torch"] = round(r["images_per_s"] / tl, 3) if dali else float("nan")
        bench.add(**r)
    path = bench.save()
    _plot(bench)
    return path


def headline(rows: pd.DataFrame) -> list[str]:
    """Per loader and cache, throttled storage, epochs 2 on: images/s against no cache."""
    need = {"loader", "cache", "epoch", "images_per_s"}
    if not need <= set(rows.columns):
        return []
    r = rows[rows["epoch"] >= 2]
    if "throttled" in r:
        r = r[r["throttled"].astype(str) == "True"]
    out = []
    for loader, g in r.groupby("loader", sort=False):
        ips = g.groupby("cache", sort=False)["images_per_s"].mean()
        if "none" not in ips:
            continue
        parts = [f"{c} {v:,.0f}/s ({v / ips['none']:.2f}x)" for c, v in ips.items() if c != "none"]
        out.append(
            f"{loader}, throttled storage, epochs 2+: no cache {ips['none']:,.0f} images/s; "
            + ", ".join(parts)
        )
    return out


BENCHMARKS.register("input")(BenchmarkSpec(run=run, replot=_plot, headline=headline))
