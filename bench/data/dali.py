"""NVIDIA DALI input pipelines (``data.loader=dali``): folders and in-memory arrays.

Two ways in for image folders:

* **reader** - ``fn.readers.file`` straight from the data set directory, sharded by rank
  (``shard_id``, ``num_shards``, ``random_shuffle``, ``pad_last_batch=True``).  Used when
  level 0 is a local directory with no cache and no throttle.  DALI pads every shard to
  the largest one by repeating its last sample (so every rank takes the same number of
  steps, and an epoch never repeats samples of another epoch); the reader's "labels" are
  the sample indices, so the padded repeats are dropped by index and the class labels are
  looked up afterwards.  Without ``stick_to_shard`` the shards rotate over the ranks every
  epoch.
* **external** - ``fn.external_source`` fed with encoded bytes from the multi-level cache
  (:mod:`bench.data.cache`), fetched by a thread pool ahead of the pipeline; DALI then
  decodes.  With ``cache=predecoded`` the source gives uint8 pixels and decoding is
  skipped.  Sharding: :func:`bench.data.storage.shard_batches` (the torch path's).

Augmentation: training = decode + random-resized-crop (fused as
``decoders.image_random_crop``, which decodes only the crop window) + flip + normalise;
evaluation = resize (shorter side = size / 0.875) + centre crop + normalise.  With CUDA
the decoder is ``mixed`` (nvJPEG) and the rest runs on the GPU; without it everything runs
on the CPU (``device_id=None``).  Progressive resizing: one pipeline per training size,
built when an epoch first needs it.  CIFAR-10 and the embedded digits go through
``fn.external_source`` from arrays (:class:`DaliArrayLoader`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from bench.data.cache import IMAGENET_MEAN, IMAGENET_STD, ZERO_STATS, CachedReader, _warn_corrupt
from bench.data.storage import shard_batches
from bench.registry import ConfigError


def require_dali():
    """Import DALI or fail with one sentence."""
    try:
        import nvidia.dali as dali  # noqa: F401
        from nvidia.dali import fn, pipeline_def, types
    except ImportError:
        raise ConfigError(
            "data.loader=dali needs NVIDIA DALI: pip install nvidia-dali-cuda120 "
            "(or the 'dali' extra), or use data.loader=torch"
        ) from None
    return fn, pipeline_def, types


def dali_device_id(device: Any, dali_device: str) -> int | None:
    """The CUDA device for GPU operators, or None for a CPU-only pipeline."""
    use_gpu = getattr(device, "type", str(device)) == "cuda"
    if dali_device == "cpu" or not use_gpu:
        if dali_device == "gpu":
            raise ConfigError("data.dali_device=gpu needs a CUDA training device")
        return None
    return device.index if device.index is not None else 0


def _augment(fn, types, images, *, train: bool, size: int, decoded_input: bool, gpu: bool,
             flip: bool, encoded: bool = True):
    """The shared DALI augmentation graph (see the module docstring)."""
    dec = "mixed" if gpu else "cpu"
    mirror = fn.random.coin_flip(probability=0.5) if (train and flip) else 0
    if train:
        if decoded_input:
            images = images.gpu() if gpu else images
            images = fn.random_resized_crop(images, size=[size, size], random_area=[0.08, 1.0],
                                            random_aspect_ratio=[3 / 4, 4 / 3])
        else:
            images = fn.decoders.image_random_crop(images, device=dec, output_type=types.RGB,
                                                   random_area=[0.08, 1.0],
                                                   random_aspect_ratio=[3 / 4, 4 / 3])
            images = fn.resize(images, resize_x=size, resize_y=size)
        crop = None
    else:
        if not decoded_input:
            images = fn.decoders.image(images, device=dec, output_type=types.RGB)
        elif gpu:
            images = images.gpu()
        images = fn.resize(images, resize_shorter=round(size / 0.875))
        crop = (size, size)
    return fn.crop_mirror_normalize(
        images, crop=crop, mirror=mirror, dtype=types.FLOAT, output_layout="CHW",
        mean=[m * 255 for m in IMAGENET_MEAN], std=[s * 255 for s in IMAGENET_STD],
    )


class _Copied:
    """A tensor list copied out of DALI's buffers (numpy or torch) before they are released."""

    def __init__(self, t: Any) -> None:
        self.t = t


def _copy(out: Any, device: Any) -> _Copied:
    if type(out).__name__ == "TensorListGPU":
        return _Copied(_to_torch(out, device).clone())
    return _Copied(np.array(out.as_array()))


def _to_torch(out: Any, device: Any):
    """A DALI TensorList (CPU or GPU) as a torch tensor on ``device``."""
    import torch

    if isinstance(out, _Copied):
        return out.t if isinstance(out.t, torch.Tensor) else torch.from_numpy(out.t)
    if type(out).__name__ == "TensorListGPU":
        from nvidia.dali.plugin.pytorch import feed_ndarray

        t = out.as_tensor()
        dst = torch.empty(t.shape(), dtype=torch.float32 if "FLOAT" in str(t.dtype) else torch.int64,
                          device=device)
        feed_ndarray(t, dst, cuda_stream=torch.cuda.current_stream(device))
        return dst
    return torch.from_numpy(out.as_array())


class DaliFolderLoader:
    """A DALI loader over a folder listing; the training-loop contract of bench.data.loaders.

    ``mode``: ``reader`` (``fn.readers.file`` on local files) or ``external`` (bytes or
    pixels from ``reader``, a :class:`CachedReader`).  ``iter_indexed()`` also yields the
    sample indices (for tests).
    """

    def __init__(self, listing: Any, *, mode: str, reader: CachedReader | None, local_root: str,
                 train: bool, batch_size: int, rank: int, world_size: int, device: Any,
                 threads: int, prefetch: int, seed: int, size_at: Callable[[int], int],
                 flip: bool, strict: bool, dali_device: str = "auto",
                 predecode_size: int = 0) -> None:
        require_dali()
        if mode not in ("reader", "external"):
            raise ValueError(mode)
        if mode == "external" and reader is None:
            raise ValueError("external mode needs a CachedReader")
        self.listing, self.mode, self.reader, self.local_root = listing, mode, reader, local_root
        self.train, self.batch_size, self.rank, self.world = train, batch_size, rank, world_size
        self.device, self.threads, self.prefetch, self.seed = device, max(1, threads), max(1, prefetch), seed
        self.size_at, self.flip, self.strict = size_at, flip, strict
        self.device_id = dali_device_id(device, dali_device)
        self.predecode_size = predecode_size
        self.labels = np.asarray(listing.labels, dtype=np.int64)
        self.epoch = 0
        self._pipes: dict[int, Any] = {}
        self._stats: dict[str, float] = dict(ZERO_STATS)
        self._seen_corrupt: set[str] = set()
        self._pool = ThreadPoolExecutor(self.threads * 2) if mode == "external" else None
        self._files = None
        if mode == "reader":
            self._files = self._checked_files()

    # -- sizes and lengths ---------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _size(self) -> int:
        return self.size_at(self.epoch)

    def __len__(self) -> int:
        if self.mode == "reader":
            n = len(self._files)
            if self.train:
                per_shard = -(-n // self.world)  # DALI pads every shard to ceil(n / S)
                return -(-per_shard // self.batch_size)
            return -(-self._shard_len(n) // self.batch_size)
        return len(shard_batches(len(self.listing), self.rank, self.world, 1, self.batch_size,
                                 self.train, self.seed, self.epoch))

    def _shard_len(self, n: int) -> int:
        lo, hi = self.rank * n // self.world, (self.rank + 1) * n // self.world
        return hi - lo

    def epoch_stats(self) -> dict[str, float]:
        if self.reader is not None:
            from bench.data.cache import merge_stats

            merge_stats(self._stats, self.reader.stats.take())
        out, self._stats = self._stats, dict(ZERO_STATS)
        return out

    def close(self) -> None:
        """Free the pipelines and the fetch threads."""
        self._pipes.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    # -- the reader path -------------------------------------------------------------------
    def _checked_files(self) -> list[tuple[str, int]]:
        """(absolute path, sample index) of the files that look like complete images.

        A truncated or non-image file would fail a whole DALI batch, so the files are
        checked (first and last bytes) once, in threads, and the bad ones are skipped with
        a warning (or stop the run with data.strict=true).
        """
        import os

        from bench.data.jpegs import jpeg_looks_complete

        def check(i: int) -> bool:
            p = os.path.join(self.local_root, self.listing.files[i])
            try:
                with open(p, "rb") as f:
                    head = f.read(8)
                    f.seek(max(0, os.path.getsize(p) - 64))
                    tail = f.read(64)
            except OSError:
                return False
            return jpeg_looks_complete(head + tail if len(head) == 8 else head)

        with ThreadPoolExecutor(8) as ex:
            ok = list(ex.map(check, range(len(self.listing))))
        bad = [self.listing.files[i] for i, good in enumerate(ok) if not good]
        if bad:
            self._stats["data/corrupt"] = len(bad)
            _warn_corrupt([f"{b}: truncated or not an image" for b in bad], self._seen_corrupt, self.strict)
        return [(os.path.join(self.local_root, self.listing.files[i]), i)
                for i, good in enumerate(ok) if good]

    def _reader_pipe(self, size: int):
        fn, pipeline_def, types = require_dali()
        files = [f for f, _ in self._files]
        idx = [i for _, i in self._files]
        gpu = self.device_id is not None

        @pipeline_def
        def pipe():
            jpegs, index = fn.readers.file(
                files=files, labels=idx, shard_id=self.rank, num_shards=self.world,
                random_shuffle=self.train, pad_last_batch=True, stick_to_shard=not self.train,
                seed=self.seed + 7919 * self.epoch, name="Reader",
            )
            images = _augment(fn, types, jpegs, train=self.train, size=size, decoded_input=False,
                              gpu=gpu, flip=self.flip)
            return images, index

        return pipe(batch_size=self.batch_size, num_threads=self.threads, device_id=self.device_id,
                    prefetch_queue_depth=self.prefetch, seed=self.seed + self.rank)

    # -- the external (cached) path --------------------------------------------------------
    def _external_pipe(self, size: int):
        fn, pipeline_def, types = require_dali()
        gpu = self.device_id is not None
        decoded = bool(self.predecode_size)

        @pipeline_def
        def pipe():
            # the source is called lazily, one batch per pipe.run(); it raises StopIteration
            # at the end of the epoch's plan (then the pipeline is reset)
            data, index = fn.external_source(
                source=self._next_batch, num_outputs=2, batch=True,
                dtype=[types.UINT8, types.INT64], layout=["HWC" if decoded else "", ""],
            )
            images = _augment(fn, types, data, train=self.train, size=size, decoded_input=decoded,
                              gpu=gpu, flip=self.flip)
            return images, index

        return pipe(batch_size=self.batch_size, num_threads=self.threads, device_id=self.device_id,
                    prefetch_queue_depth=self.prefetch, seed=self.seed + self.rank + 7919 * self.epoch)

    def _fetch_one(self, i: int) -> tuple[np.ndarray | None, str | None]:
        from bench.data.jpegs import CorruptImage, jpeg_looks_complete

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

    def _submit_batch(self, batch: np.ndarray) -> list:
        return [(i, self._pool.submit(self._fetch_one, i)) for i in batch.tolist()]

    @staticmethod
    def _gather(futs: list) -> tuple[list[np.ndarray], list[np.ndarray], list[str]]:
        data, index, bad = [], [], []
        for i, f in futs:
            d, err = f.result()
            if d is None:
                bad.append(err)
            else:
                data.append(d)
                index.append(np.array(i, dtype=np.int64))
        return data, index, bad

    # -- iteration ---------------------------------------------------------------------------
    def _pipe(self):
        size = self._size()
        if size not in self._pipes:
            self._pipes.clear()  # progressive resizing goes one way; free the old pipeline
            p = self._reader_pipe(size) if self.mode == "reader" else self._external_pipe(size)
            p.build()
            self._pipes[size] = p
        return self._pipes[size]

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for x, y, _ in self.iter_indexed():
            yield x, y

    def iter_indexed(self) -> Iterator[tuple[Any, Any, Any]]:
        import torch

        pipe = self._pipe()
        steps = len(self)
        seen: set[int] = set()
        gen = self._run_reader(pipe, steps) if self.mode == "reader" else self._run_external(pipe)
        t0 = time.perf_counter()
        for images, index in gen:
            self._stats["data/wait_s"] = self._stats.get("data/wait_s", 0.0) + time.perf_counter() - t0
            idx = _to_torch(index, torch.device("cpu")).view(-1)
            x = _to_torch(images, self.device)
            if self.mode == "reader":  # drop pad_last_batch's repeats by sample index
                keep = []
                for k, i in enumerate(idx.tolist()):
                    if i not in seen:
                        seen.add(i)
                        keep.append(k)
                if not keep and self.train:
                    keep = [0]  # an all-padding batch: keep one sample so every rank steps
                self._stats["cache/misses"] += len(keep)  # every file came from level 0
                if len(keep) < len(idx):
                    x, idx = x[torch.tensor(keep, device=x.device)], idx[keep]
            if len(idx):
                y = torch.from_numpy(self.labels[idx.numpy()]).to(self.device)
                yield x.to(self.device), y, idx
            t0 = time.perf_counter()

    def _run_reader(self, pipe, steps: int):
        for _ in range(steps):
            images, index = self._run(pipe.run, "")
            yield images, index

    def _run_external(self, pipe):
        batches = shard_batches(len(self.listing), self.rank, self.world, 1, self.batch_size,
                                self.train, self.seed, self.epoch)
        # fetch ahead of DALI: the files of a few batches are in flight in the thread pool
        self._todo = list(batches)
        self._futs = []
        self._error = None
        self._top_up()
        while True:
            try:
                images, index = self._run(pipe.run, "")
            except StopIteration:
                pipe.reset()
                break
            yield images, index
        if self._error is not None:
            raise self._error

    def _top_up(self) -> None:
        ahead = 2 * self.prefetch + 1
        while self._todo and len(self._futs) < ahead:
            self._futs.append(self._submit_batch(self._todo.pop(0)))

    def _next_batch(self):
        """external_source's callback: the next fetched batch with at least one good image."""
        from bench.data.jpegs import CorruptImage

        while self._futs:
            data, index, bad = self._gather(self._futs.pop(0))
            self._top_up()
            if bad:
                self._stats["data/corrupt"] = self._stats.get("data/corrupt", 0) + len(bad)
                try:
                    _warn_corrupt(bad, self._seen_corrupt, self.strict)
                except CorruptImage as e:
                    self._error, self._futs, self._todo = e, [], []
                    break
            if data:
                return data, index
        raise StopIteration

    def _run(self, call: Callable, names: str):
        try:
            return call()
        except RuntimeError as e:
            where = f" (files {names} ...)" if names else " (run data.loader=torch to name the file)"
            raise RuntimeError(f"DALI could not process a batch on rank {self.rank}{where}: {e}") from e


# -- building the loaders of an image folder (data.loader=torch|dali, cache=...) ---------------

def predecode_size(data_cfg: Any, cache_cfg: Any) -> int:
    """Shorter side (pixels) for pre-decoded images: 8/7 x the largest size the run uses.

    8/7 = 1 / 0.875 is the evaluation resize ratio; random-resized crops of the training
    sizes then rarely need to upsample.
    """
    from bench.data.config import train_sizes

    if cache_cfg.predecode_size:
        return int(cache_cfg.predecode_size)
    return round(max(train_sizes(data_cfg) + [data_cfg.eval_image_size]) / 0.875)


def uses_cached_input(data_cfg: Any, cache_cfg: Any) -> bool:
    """Whether a folder data set needs this module's loaders instead of plain torchvision."""
    from bench.data.storage import is_url

    return (data_cfg.loader == "dali" or cache_cfg.name != "none" or bool(data_cfg.progressive)
            or data_cfg.throttle_mbps > 0 or data_cfg.throttle_ms > 0 or is_url(data_cfg.root))


def build_folder(data_cfg: Any, cache_cfg: Any, rank: int, world_size: int, device: Any, seed: int):
    """The DataBundle of an ImageNet-style folder read through the cache (torch or DALI)."""
    from functools import partial

    from bench.data import DataBundle, _per_rank
    from bench.data.cache import CACHES, CachedFolderLoader, FolderDataset, build_reader
    from bench.data.config import train_size_at
    from bench.data.storage import LocalStorage, list_folder, open_storage

    store = open_storage(data_cfg.root, data_cfg.throttle_mbps, data_cfg.throttle_ms)
    tr = list_folder(store, data_cfg.train_dir)
    va = list_folder(store, data_cfg.val_dir, tr.classes)
    n_classes = len(tr.classes)
    if data_cfg.num_classes and data_cfg.num_classes != n_classes:
        raise ConfigError(f"data.num_classes={data_cfg.num_classes} but {data_cfg.root} has {n_classes} class folders")
    b = _per_rank(data_cfg.batch_size, world_size, "data.batch_size")
    eb = max(1, data_cfg.eval_batch_size // world_size)
    levels = CACHES.get(cache_cfg.name)
    pre = predecode_size(data_cfg, cache_cfg) if levels.decoded else 0
    train_size = partial(train_size_at, data_cfg)

    def eval_size(epoch: int) -> int:
        return data_cfg.eval_image_size

    if data_cfg.loader == "dali":
        plain = isinstance(store, LocalStorage) and cache_cfg.name == "none"

        def reader():  # one per loader: evaluation reads never count in the training epoch
            return None if plain else build_reader(store, cache_cfg, store.root)

        common = dict(mode="reader" if plain else "external", local_root=store.root, rank=rank, world_size=world_size, device=device,
                      threads=data_cfg.dali_threads or max(1, data_cfg.num_workers),
                      prefetch=data_cfg.prefetch, seed=seed, flip=data_cfg.flip,
                      strict=data_cfg.strict, dali_device=data_cfg.dali_device, predecode_size=pre)
        train = DaliFolderLoader(tr, train=True, batch_size=b, size_at=train_size, reader=reader(), **common)
        ev = DaliFolderLoader(va, train=False, batch_size=eb, size_at=eval_size, reader=reader(), **common)
    else:
        workers = data_cfg.num_workers
        common = dict(rank=rank, world_size=world_size, device=device, num_workers=workers,
                      seed=seed, strict=data_cfg.strict, prefetch=data_cfg.prefetch)
        share = max(1, workers)
        train = CachedFolderLoader(
            FolderDataset(store, tr, cache_cfg, store.root, True, data_cfg.flip, pre, share),
            batch_size=b, size_at=train_size, **common)
        ev = CachedFolderLoader(
            FolderDataset(store, va, cache_cfg, store.root, False, False, pre, share),
            batch_size=eb, size_at=eval_size, **common)
    return DataBundle(train, ev, n_classes, len(train) * data_cfg.batch_size)


def validate_input(data_cfg: Any, cache_cfg: Any) -> None:
    """Configuration-time checks of the input-pipeline settings (ConfigError on bad ones)."""
    from bench.data.cache import validate_cache

    validate_cache(cache_cfg)
    if data_cfg.loader == "dali":
        require_dali()
    if data_cfg.dali_device not in ("auto", "cpu", "gpu"):
        raise ConfigError(f"data.dali_device={data_cfg.dali_device!r}; choose auto, cpu or gpu")
    if data_cfg.dali_threads < 0 or data_cfg.prefetch < 1:
        raise ConfigError("data.dali_threads must be >= 0 and data.prefetch >= 1")
    if data_cfg.throttle_mbps < 0 or data_cfg.throttle_ms < 0:
        raise ConfigError("data.throttle_mbps and data.throttle_ms must be >= 0 (0 = off)")
    for pair in data_cfg.progressive:
        if len(pair) != 2 or int(pair[0]) < 0 or int(pair[1]) <= 0:
            raise ConfigError(f"data.progressive entries are [epoch >= 0, size > 0] pairs, got {list(pair)}")


class DaliArrayLoader:
    """In-memory image arrays (CIFAR-10, the embedded digits) through ``fn.external_source``.

    Training: random crop with ``pad`` pixels of padding (the padding is filled with the
    mean colour, which normalises to zero like the torch path's zero padding of normalised
    images) + optional flip + normalise, by ``crop_mirror_normalize``; evaluation:
    normalise only.  Sharding as :func:`bench.data.storage.shard_batches`.
    """

    def __init__(self, images: Any, labels: Any, *, batch_size: int, rank: int, world_size: int,
                 device: Any, mean: Any, std: Any, train: bool, seed: int = 0, pad: int = 0,
                 flip: bool = False, threads: int = 1, prefetch: int = 2,
                 dali_device: str = "auto") -> None:
        require_dali()
        x = np.ascontiguousarray(images.numpy().transpose(0, 2, 3, 1))  # NHWC, as DALI wants
        self.h, self.w = x.shape[1:3]
        self.mean = [float(m) for m in mean]
        self.std = [float(s) for s in std]
        if train and pad:
            padded = np.empty((x.shape[0], self.h + 2 * pad, self.w + 2 * pad, x.shape[3]), dtype=x.dtype)
            padded[...] = np.asarray(self.mean, dtype=np.float64).astype(x.dtype)
            padded[:, pad:pad + self.h, pad:pad + self.w] = x
            x = padded
        self.x, self.labels = x, labels.numpy().astype(np.int64)
        self.batch_size, self.rank, self.world, self.device = batch_size, rank, world_size, device
        self.train, self.seed, self.pad, self.flip = train, seed, pad, flip
        self.threads, self.prefetch = max(1, threads), max(1, prefetch)
        self.device_id = dali_device_id(device, dali_device)
        self.epoch = 0
        n = len(self.labels)
        self.num_samples = n // world_size if train else len(range(rank, n, world_size))  # this rank's
        self._batches: list[np.ndarray] = []
        self._pipe = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _plan(self) -> list[np.ndarray]:
        return shard_batches(len(self.labels), self.rank, self.world, 1, self.batch_size,
                             self.train, self.seed, self.epoch)

    def __len__(self) -> int:
        return len(self._plan())

    def epoch_stats(self) -> dict[str, float]:
        return {}

    def _next(self):
        if not self._batches:
            raise StopIteration
        b = self._batches.pop(0)
        return [self.x[i] for i in b], [np.array(i, dtype=np.int64) for i in b]

    def _build(self):
        fn, pipeline_def, types = require_dali()
        gpu = self.device_id is not None
        dtype = types.UINT8 if self.x.dtype == np.uint8 else types.FLOAT

        @pipeline_def
        def pipe():
            images, index = fn.external_source(source=self._next, num_outputs=2, batch=True,
                                               dtype=[dtype, types.INT64], layout=["HWC", ""])
            if gpu:
                images = images.gpu()
            kw: dict[str, Any] = {}
            if self.train:
                kw = dict(crop=(self.h, self.w), crop_pos_x=fn.random.uniform(range=(0.0, 1.0)),
                          crop_pos_y=fn.random.uniform(range=(0.0, 1.0)),
                          mirror=fn.random.coin_flip(probability=0.5) if self.flip else 0)
            images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                              mean=self.mean, std=self.std, **kw)
            return images, index

        p = pipe(batch_size=self.batch_size, num_threads=self.threads, device_id=self.device_id,
                 prefetch_queue_depth=self.prefetch, seed=self.seed + self.rank)
        p.build()
        return p

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        import torch

        if self._pipe is None:
            self._pipe = self._build()
        self._batches = self._plan()
        while True:
            try:
                images, index = self._pipe.run()
            except StopIteration:
                self._pipe.reset()
                break
            idx = _to_torch(index, torch.device("cpu")).view(-1).numpy()
            yield _to_torch(images, self.device).to(self.device), torch.from_numpy(self.labels[idx]).to(self.device)
