"""NVIDIA DALI input pipelines (``data.loader=dali``) for image folders: ``fn.external_source``
fed from the data cache by a thread pool, batches by :func:`bench.data.loaders.rank_batches`
(docs/internals/data.md)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from bench.data.cache import CachedReader, merge_stats, zero_stats
from bench.data.folder import IMAGENET_MEAN, IMAGENET_STD
from bench.data.jpegs import CorruptImage, jpeg_looks_complete, warn_corrupt
from bench.data.loaders import SAMPLES, RankLoader
from bench.registry import ConfigError


def require_dali():
    """Import DALI or fail with one sentence."""
    try:
        # deferred: DALI is optional (GPU machines), loaded only when asked for
        from nvidia.dali import fn, pipeline_def, types
    except ImportError:
        raise ConfigError(
            "data.loader=dali needs NVIDIA DALI: pip install nvidia-dali-cuda120 "
            "(or the 'dali' extra), or use data.loader=torch"
        ) from None
    return fn, pipeline_def, types


def dali_device_id(device: Any, dali_device: str) -> int | None:
    """The CUDA device for GPU operators, or None for a CPU-only pipeline."""
    device = torch.device(device)
    if str(dali_device) not in ("auto", "cpu", "gpu"):
        raise ConfigError(f"data.dali_device must be auto, cpu or gpu, got {dali_device!r}")
    if dali_device == "cpu" or device.type != "cuda":
        if dali_device == "gpu":
            raise ConfigError("data.dali_device=gpu needs a CUDA training device")
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def to_torch(out: Any, device: Any, *, wrap: bool = False):
    """A dense DALI TensorList as a torch tensor on ``device``: wrapped by DLPack when ``wrap``
    (outputs of DALI's dynamic executor are the caller's), else copied on torch's stream."""
    device = torch.device(device)
    gpu = type(out).__name__ == "TensorListGPU"
    if gpu and device.type != "cuda":
        out, gpu = out.as_cpu(), False
    t = out.as_tensor()
    if wrap:
        x = torch.from_dlpack(t)
    elif gpu:
        # deferred: DALI is optional (GPU machines), loaded only when asked for
        from nvidia.dali.plugin.pytorch import feed_ndarray, to_torch_type

        cuda = torch.device("cuda", out.device_id())
        x = torch.empty(t.shape(), dtype=to_torch_type[t.dtype], device=cuda)
        feed_ndarray(t, x, cuda_stream=torch.cuda.current_stream(cuda))
    else:
        x = torch.from_numpy(out.as_array())
    return to_device(x, device)


def to_device(x: Any, device: Any):
    """``x`` on ``device``; host to GPU without waiting for the GPU's queued work (blocking
    only from pinned memory that torch did not allocate)."""
    device = torch.device(device)
    if device.type == "cuda" and not x.is_cuda:
        return x.to(device, non_blocking=not x.is_pinned())
    return x.to(device)


class ExternalFeed:
    """Encoded bytes (or pre-decoded uint8 pixels) of one epoch's batches, fetched ahead."""

    def __init__(self, ld: DaliFolderLoader) -> None:
        self.listing, self.reader, self.predecode_size = ld.listing, ld.reader, ld.predecode_size
        self.strict, self.stats = ld.strict, ld._stats  # the loader's counters, shared
        self.ahead = 2 * ld.prefetch + 1  # batches in flight
        self.pool = ThreadPoolExecutor(ld.threads * 2)
        self.seen_corrupt: set[str] = set()
        self.todo: list[np.ndarray] = []
        self.futs: list[list] = []
        self.error: Exception | None = None

    def start(self, plan: list[np.ndarray]) -> None:
        """Begin an epoch: ``plan`` = this rank's batches of sample indices."""
        self.stop()
        self.todo, self.error = list(plan), None
        self._top_up()

    def stop(self) -> None:
        """Drop the rest of the epoch: the next call raises StopIteration."""
        for batch in self.futs:
            for _, f in batch:
                f.cancel()  # not started yet: never read; running ones finish unseen
        self.todo, self.futs = [], []

    def close(self) -> None:
        self.stop()
        self.pool.shutdown(wait=True)

    def _fetch_one(self, i: int) -> tuple[np.ndarray | None, str | None]:
        rel = self.listing.files[i]
        if self.predecode_size:
            try:
                return self.reader.get_decoded(rel, self.predecode_size), None
            except CorruptImage as e:
                return None, str(e)
        data = self.reader.get(rel)
        if not jpeg_looks_complete(data):
            return None, f"{rel}: truncated or not an image"
        return np.frombuffer(data, dtype=np.uint8), None

    def _top_up(self) -> None:
        while self.todo and len(self.futs) < self.ahead:
            batch = self.todo.pop(0)
            self.futs.append([(i, self.pool.submit(self._fetch_one, i)) for i in batch.tolist()])

    def __call__(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """external_source's callback: the next fetched batch with at least one good image."""
        while self.futs:
            data, index, bad = [], [], []
            for i, f in self.futs.pop(0):
                d, err = f.result()
                if d is None:
                    bad.append(err)
                else:
                    data.append(d)
                    index.append(np.array(i, dtype=np.int64))
            self._top_up()
            if bad:
                self.stats["data/corrupt"] = self.stats.get("data/corrupt", 0) + len(bad)
                try:
                    warn_corrupt(bad, self.seen_corrupt, self.strict)
                except CorruptImage as e:
                    self.error = e
                    self.stop()
                    break
            if data:
                return data, index
        raise StopIteration


class DaliFolderLoader(RankLoader):
    """A DALI pipeline over a folder listing, fed from ``reader`` by an :class:`ExternalFeed`;
    ``iter_indexed()`` also yields the sample indices."""

    def __init__(
        self,
        listing: Any,
        *,
        reader: CachedReader,
        train: bool,
        batch_size: int,
        rank: int,
        world_size: int,
        device: Any,
        size_at: Callable[[int], int],
        flip: bool,
        strict: bool,
        threads: int = 1,
        prefetch: int = 2,
        seed: int = 0,
        dali_device: str = "auto",
        predecode_size: int = 0,
    ) -> None:
        require_dali()
        self.train, self.batch_size, self.rank, self.world = train, batch_size, rank, world_size
        self.device, self.threads, self.prefetch = device, max(1, threads), max(1, prefetch)
        self.seed, self.device_id = seed, dali_device_id(device, dali_device)
        self.listing, self.reader, self.n = listing, reader, len(listing)
        self.size_at, self.flip, self.strict = size_at, flip, strict
        self.predecode_size = predecode_size
        self.labels = np.asarray(listing.labels, dtype=np.int64)
        self._stats: dict[str, float] = zero_stats()
        self.feed = ExternalFeed(self)
        self._pipe: tuple[Any, Any] = (None, None)  # (image size, built pipeline)
        self._open: Any = None  # the pipeline whose epoch has not ended

    @property
    def fetch_threads(self) -> int:
        """Threads reading files ahead of DALI."""
        return self.feed.pool._max_workers

    def set_epoch(self, epoch: int) -> None:
        self._end_open_epoch()
        self.epoch = epoch

    def epoch_stats(self) -> dict[str, float]:
        merge_stats(self._stats, self.reader.stats.take())
        out = dict(self._stats)
        self._stats.clear()  # the feed holds this dict: reset it in place
        self._stats.update(zero_stats())
        return out

    def close(self) -> None:
        """Free the pipeline and the fetch threads."""
        self._pipe = (None, None)
        self.feed.close()

    def _augment(self, fn: Any, types: Any, images: Any, size: int, decoded: bool):
        """Random-resized crop + flip (training) or resize + centre crop (evaluation), then
        normalise; JPEGs decoded by nvJPEG (``mixed``) on CUDA."""
        gpu, train = self.device_id is not None, self.train
        # mixed: the decoder's host threads are not pinned to cores (affine=False), since
        # several training processes of a node may each run a pipeline on their own GPU
        dec_kw: dict[str, Any] = {"device": "mixed" if gpu else "cpu", "output_type": types.RGB}
        if gpu:
            dec_kw["affine"] = False
        mirror = fn.random.coin_flip(probability=0.5) if (train and self.flip) else 0
        if decoded and gpu:
            images = images.gpu()
        area, ratio = [0.08, 1.0], [3 / 4, 4 / 3]
        crop = None
        if train and decoded:
            images = fn.random_resized_crop(
                images, size=[size, size], random_area=area, random_aspect_ratio=ratio
            )
        elif train:
            images = fn.decoders.image_random_crop(
                images, **dec_kw, random_area=area, random_aspect_ratio=ratio
            )
            images = fn.resize(images, resize_x=size, resize_y=size)
        else:
            if not decoded:
                images = fn.decoders.image(images, **dec_kw)
            images = fn.resize(images, resize_shorter=round(size / 0.875))
            crop = (size, size)
        mean, std = [m * 255 for m in IMAGENET_MEAN], [s * 255 for s in IMAGENET_STD]
        kw = dict(crop=crop, mirror=mirror, mean=mean, std=std)
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", **kw)

    def _external_pipe(self, size: int):
        fn, pipeline_def, types = require_dali()
        decoded = bool(self.predecode_size)  # the source gives HWC pixels, else file bytes
        # no_copy: DALI reads the fetched arrays in place; ``keep`` holds the latest batches
        # until the pipeline is done with them (it calls the source ahead of run())
        keep: deque = deque(maxlen=2 * self.prefetch + 4)

        def source():
            keep.append(self.feed())
            return keep[-1]

        @pipeline_def
        def pipe():
            layout = ["HWC" if decoded else "", ""]
            kw = dict(num_outputs=2, batch=True, dtype=[types.UINT8, types.INT64], layout=layout)
            images, index = fn.external_source(source=source, no_copy=True, **kw)
            return self._augment(fn, types, images, size, decoded), index

        kw = dict(device_id=self.device_id, prefetch_queue_depth=self.prefetch)
        return pipe(
            batch_size=self.batch_size, num_threads=self.threads, seed=self.seed + self.rank, **kw
        )

    def _built(self, size: int):
        """The pipeline for ``size``, built (and the previous one freed) when it changes."""
        if self._pipe[0] != size:
            self._pipe = (None, None)  # progressive resizing goes one way: free the old one
            pipe = self._external_pipe(size)
            pipe.build()
            self._pipe = (size, pipe)
        return self._pipe[1]

    def _end_open_epoch(self) -> None:
        """Close an epoch the training loop cut short: stop the source, drain, reset."""
        pipe, self._open = self._open, None
        if pipe is None:
            return
        self.feed.stop()
        while True:
            try:
                pipe.run()
            except StopIteration:
                break
        pipe.reset()

    def iter_indexed(self) -> Iterator[tuple[Any, Any, Any]]:
        self._end_open_epoch()
        plan = self._plan()
        if not plan:
            return
        pipe = self._built(self.size_at(self.epoch))
        self.feed.start(plan)
        self._open = pipe
        wrap = bool(getattr(pipe, "exec_dynamic", False))  # DALI's dynamic executor
        t0 = time.perf_counter()
        while True:
            try:
                images, index = pipe.run()
            except StopIteration:
                pipe.reset()
                self._open = None
                break
            except RuntimeError as e:
                raise RuntimeError(
                    f"DALI could not process a batch on rank {self.rank} "
                    f"(run data.loader=torch to name the file): {e}"
                ) from e
            merge_stats(self._stats, {"data/wait_s": time.perf_counter() - t0})
            idx = to_torch(index, torch.device("cpu")).view(-1)  # a copy: see _external_pipe
            y = to_device(torch.from_numpy(self.labels[idx.numpy()]), self.device)
            self._stats[SAMPLES] += len(idx)
            yield to_torch(images, self.device, wrap=wrap), y, idx
            t0 = time.perf_counter()
        if self.feed.error is not None:
            raise self.feed.error
