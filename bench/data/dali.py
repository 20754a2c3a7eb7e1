"""NVIDIA DALI input pipelines over image folders (``data.loader=dali``).

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

Augmentation: :func:`bench.data.dali_common.augment`.  Progressive resizing: one pipeline
per training size, built when an epoch first needs it.  CIFAR-10 and the embedded digits
go through ``fn.external_source`` from arrays (:mod:`bench.data.dali_arrays`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from bench.data.cache import ZERO_STATS, CachedReader
from bench.data.cached_folder import warn_corrupt
from bench.data.dali_common import augment, dali_device_id, require_dali, to_torch
from bench.data.storage import shard_batches


class DaliFolderLoader:
    """A DALI loader over a folder listing; the training-loop contract of bench.data.loaders.

    ``mode``: ``reader`` (``fn.readers.file`` on local files) or ``external`` (bytes or
    pixels from ``reader``, a :class:`CachedReader`).  ``iter_indexed()`` also yields the
    sample indices (for tests).
    """

    def __init__(
        self,
        listing: Any,
        *,
        mode: str,
        reader: CachedReader | None,
        local_root: str,
        train: bool,
        batch_size: int,
        rank: int,
        world_size: int,
        device: Any,
        threads: int,
        prefetch: int,
        seed: int,
        size_at: Callable[[int], int],
        flip: bool,
        strict: bool,
        dali_device: str = "auto",
        predecode_size: int = 0,
    ) -> None:
        require_dali()
        if mode not in ("reader", "external"):
            raise ValueError(mode)
        if mode == "external" and reader is None:
            raise ValueError("external mode needs a CachedReader")
        self.listing, self.mode, self.reader, self.local_root = listing, mode, reader, local_root
        self.train, self.batch_size, self.rank, self.world = train, batch_size, rank, world_size
        self.device, self.threads, self.prefetch, self.seed = (
            device,
            max(1, threads),
            max(1, prefetch),
            seed,
        )
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
        return len(
            shard_batches(
                len(self.listing),
                self.rank,
                self.world,
                1,
                self.batch_size,
                self.train,
                self.seed,
                self.epoch,
            )
        )

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
            warn_corrupt(
                [f"{b}: truncated or not an image" for b in bad], self._seen_corrupt, self.strict
            )
        return [
            (os.path.join(self.local_root, self.listing.files[i]), i)
            for i, good in enumerate(ok)
            if good
        ]

    def _reader_pipe(self, size: int):
        fn, pipeline_def, types = require_dali()
        files = [f for f, _ in self._files]
        idx = [i for _, i in self._files]
        gpu = self.device_id is not None

        @pipeline_def
        def pipe():
            jpegs, index = fn.readers.file(
                files=files,
                labels=idx,
                shard_id=self.rank,
                num_shards=self.world,
                random_shuffle=self.train,
                pad_last_batch=True,
                stick_to_shard=not self.train,
                seed=self.seed + 7919 * self.epoch,
                name="Reader",
            )
            images = augment(
                fn,
                types,
                jpegs,
                train=self.train,
                size=size,
                decoded_input=False,
                gpu=gpu,
                flip=self.flip,
            )
            return images, index

        return pipe(
            batch_size=self.batch_size,
            num_threads=self.threads,
            device_id=self.device_id,
            prefetch_queue_depth=self.prefetch,
            seed=self.seed + self.rank,
        )

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
                source=self._next_batch,
                num_outputs=2,
                batch=True,
                dtype=[types.UINT8, types.INT64],
                layout=["HWC" if decoded else "", ""],
            )
            images = augment(
                fn,
                types,
                data,
                train=self.train,
                size=size,
                decoded_input=decoded,
                gpu=gpu,
                flip=self.flip,
            )
            return images, index

        return pipe(
            batch_size=self.batch_size,
            num_threads=self.threads,
            device_id=self.device_id,
            prefetch_queue_depth=self.prefetch,
            seed=self.seed + self.rank + 7919 * self.epoch,
        )

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
            self._stats["data/wait_s"] = (
                self._stats.get("data/wait_s", 0.0) + time.perf_counter() - t0
            )
            idx = to_torch(index, torch.device("cpu")).view(-1)
            x = to_torch(images, self.device)
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
        batches = shard_batches(
            len(self.listing),
            self.rank,
            self.world,
            1,
            self.batch_size,
            self.train,
            self.seed,
            self.epoch,
        )
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
                    warn_corrupt(bad, self._seen_corrupt, self.strict)
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
            where = (
                f" (files {names} ...)" if names else " (run data.loader=torch to name the file)"
            )
            raise RuntimeError(
                f"DALI could not process a batch on rank {self.rank}{where}: {e}"
            ) from e
