"""Benchmark ``input_gpu``: images/s of a warm training epoch, DALI on the GPU vs on the CPU
vs torchvision, and the pre-decoded cache level.

One untimed warm-up epoch per case, then interleaved epochs; a case that cannot run says
why.  Columns and protocol: docs/internals/benchmarks.md (input_gpu).
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import torch
from torch.utils.data import DataLoader

from bench.benchmarks import BENCHMARKS, BenchmarkSpec
from bench.benchmarks.harness import BenchRun, have_dali, latest_run, usable_cores
from bench.benchmarks.timing import interleaved_times, summarize
from bench.data.cache import build_reader
from bench.data.config import CacheConfig
from bench.data.dali import DaliFolderLoader
from bench.data.folder import build_transforms, check_split
from bench.data.jpegs import cached_jpeg_folder
from bench.data.storage import LocalStorage, list_folder
from bench.results.plots import BENCH_COLOURS, save_figure

CASES = ("torchvision", "dali_mixed", "dali_cpu", "dali_predecoded")
OUT = 224  # training crop (pixels)
BATCH = 32


class _Epochs:
    """One call = one full training epoch of a loader (its next epoch number); ``device``:
    where the batches are moved, for a loader that leaves them on the host."""

    def __init__(self, loader: Any, close: Callable[[], None] | None = None, device: Any = None):
        self.loader, self._close, self.device, self.epoch, self.images = (
            loader,
            close,
            device,
            0,
            [],
        )

    def close(self) -> None:
        if self._close is not None:
            self._close()
        self.loader = None  # a DataLoader's persistent workers stop with it

    def __call__(self) -> None:
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(self.epoch)
        self.epoch += 1
        n, nb = 0, self.device is not None and self.device.type == "cuda"
        for x, y in self.loader:
            if self.device is not None:
                x, y = x.to(self.device, non_blocking=nb), y.to(self.device, non_blocking=nb)
            assert x.device == y.device
            n += x.shape[0]
        self.images.append(n)


def _torchvision(root: str, size: int, batch: int, workers: int, device: Any) -> _Epochs:
    # deferred: torchvision is slow to load, and only this path needs it
    from torchvision.datasets import ImageFolder

    transform, _ = build_transforms(size, size, flip=True)
    train = ImageFolder(str(check_split(root, "train")), transform=transform)
    dl = DataLoader(
        train,
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
        prefetch_factor=2 if workers > 0 else None,
        generator=torch.Generator().manual_seed(0),
    )
    return _Epochs(dl, device=device)


def _dali(
    root: str, size: int, batch: int, threads: int, device: Any, where: str, cache: str, tmp: str
) -> _Epochs:
    store = LocalStorage(root)
    cfg = CacheConfig(name=cache, dir=tmp, disk_gb=10.0, memory_gb=8.0, predecode_size=0)
    loader = DaliFolderLoader(
        list_folder(store, "train"),
        reader=build_reader(store, cfg, root),
        train=True,
        batch_size=batch,
        rank=0,
        world_size=1,
        device=device,
        threads=threads,
        prefetch=2,
        seed=0,
        size_at=lambda epoch: size,
        flip=True,
        strict=False,
        dali_device=where,
        predecode_size=size if cache == "predecoded" else 0,  # marks the level as decoded
    )
    return _Epochs(loader, loader.close)


def measure(quick: bool = False, dali: bool | None = None) -> list[dict[str, Any]]:
    """The rows of one run (every case; skipped ones say why)."""
    cores = 2 if quick else usable_cores()
    images, size, batch, workers, reps = (
        (64, 32, 8, 2, 2) if quick else (64 * max(2, cores), OUT, BATCH, cores, 5)
    )
    dali = have_dali() if dali is None else dali
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    root = cached_jpeg_folder(images, 4 if quick else 16, small=quick, workers=max(2, cores))
    tmp = tempfile.mkdtemp(prefix="tkb-input-gpu-")

    def make(c: str) -> _Epochs:
        if c == "torchvision":
            return _torchvision(root, size, batch, workers, device)
        where = "cpu" if c == "dali_cpu" else "auto"
        cache = "predecoded" if c == "dali_predecoded" else "none"
        return _dali(root, size, batch, workers, device, where, cache, tmp)

    skipped = dict.fromkeys(CASES, "")
    if not dali:
        skipped.update(dict.fromkeys(CASES[1:], "NVIDIA DALI is not installed"))
    elif not cuda:
        skipped["dali_mixed"] = "no CUDA device"
    for c, why in skipped.items():
        if why:
            print(f"  {c}: skipped ({why})", flush=True)
    runs: dict[str, _Epochs] = {}
    try:
        for c in CASES:  # torchvision first: its workers fork before any DALI thread runs
            if skipped[c]:
                continue
            try:
                runs[c] = make(c)
                runs[c]()  # the warm-up epoch, untimed
            except Exception as e:  # noqa: BLE001 - one case failing keeps the others' rows
                traceback.print_exc()
                skipped[c] = f"failed: {type(e).__name__}: {e}"[:300]
                print(f"  {c}: {skipped[c]}", flush=True)
                if c in runs:
                    runs.pop(c).close()
        load = round(os.getloadavg()[0], 2)
        times = interleaved_times(runs, warmup=0, reps=reps)
    finally:
        for r in runs.values():
            r.close()
        runs_images = {c: r.images for c, r in runs.items()}
        del runs
        gc.collect()
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for c in CASES:
        row: dict[str, Any] = dict(case=c, library="torchvision" if c == "torchvision" else "dali")
        row["device"] = "gpu" if c in ("dali_mixed", "dali_predecoded") and cuda else "cpu"
        row.update(train_device=device.type, images=images // batch * batch, batch=batch)
        row.update(image_size=size, workers=workers, reps=reps, skipped=skipped[c])
        if not skipped[c]:
            imgs = set(runs_images[c])
            if imgs != {row["images"]}:
                raise RuntimeError(f"{c} read {sorted(imgs)} images per epoch, not {row['images']}")
            s = summarize(times[c])
            row.update({k: round(v, 2) for k, v in s.items() if k != "reps"})
            row.update(images_per_s=round(row["images"] / (s["median_ms"] / 1e3), 1), load_1m=load)
        rows.append(row)
    base = rows[0].get("images_per_s")  # torchvision
    for r in rows:
        ips = r.get("images_per_s")
        r["vs_torchvision"] = round(ips / base, 3) if ips and base else float("nan")
        if ips:
            print(f"  {r['case']:16s} {r['device']}: {ips:9.1f} images/s "
                  f"({r['vs_torchvision']:.2f}x torchvision)", flush=True)  # fmt: skip
    return rows


def _plot(bench: BenchRun) -> None:
    df = latest_run(bench.csv_path)
    skipped = df["skipped"].fillna("").astype(str)
    fig, ax = plt.subplots(figsize=(8, 1.9 + 0.55 * len(df)))
    y = list(range(len(df)))
    labels = [f"{c} (decode on {d})" for c, d in zip(df["case"], df["device"], strict=True)]
    ips = df["images_per_s"].astype(float).fillna(0.0)
    # the inter-quartile range of the epoch time, as images / s
    med, iqr = df["median_ms"].astype(float), df["iqr_ms"].astype(float)
    lo = df["images"] / ((med + iqr / 2) / 1e3)
    hi = df["images"] / ((med - iqr / 2).clip(lower=1e-9) / 1e3)
    err = [(ips - lo).fillna(0).clip(lower=0), (hi - ips).fillna(0).clip(lower=0)]
    ax.barh(y, ips, xerr=err, capsize=3, color=BENCH_COLOURS["images"])
    top = float(ips.max()) or 1.0
    for i, r in enumerate(df.itertuples()):
        why = skipped.iloc[i]
        if why:
            text = f"not measured: {why}"
        elif i == 0:
            text = f"{r.images_per_s:,.0f} images/s (the baseline)"
        else:
            text = f"{r.images_per_s:,.0f} images/s, {r.vs_torchvision:.2f}x torchvision"
        end = ips.iloc[i] + float(err[1].iloc[i])
        ax.annotate(text, (0 if why else end, i), xytext=(6, 0),
                    textcoords="offset points", va="center", fontsize=8,
                    color="firebrick" if why else "k")  # fmt: skip
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.9 * top)  # room for the numbers written beside the bars
    reps = f", median of n = {int(df['reps'].iloc[0])} epochs"
    ax.set_xlabel(f"training images / s (warm epoch{reps}; bar: inter-quartile range)")
    r = df.iloc[0]
    ax.set_title(
        f"{int(r['images'])} JPEGs, RRC {int(r['image_size'])} + flip, batch {int(r['batch'])};"
        f" {int((skipped == '').sum())} of {len(df)} input pipelines measured on\n{r['hardware']}",
        fontsize=9,
    )
    ax.grid(axis="x", alpha=0.3)
    save_figure(fig, bench.png_path)


def run(results_dir: str = "results", quick: bool = False) -> Path:
    """Measure every case; CSV + PNG; returns the CSV."""
    bench = BenchRun("input_gpu", results_dir)
    for r in measure(quick):
        bench.add(**r)
    path = bench.save()
    _plot(bench)
    return path


BENCHMARKS.register("input_gpu")(BenchmarkSpec(run=run, replot=_plot))
