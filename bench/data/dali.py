"""NVIDIA DALI input pipelines over image folders (``data.loader=dali``).

Two ways in for image folders:

* **reader** - ``fn.readers.file`` straight from the data set directory.  Used when
  level 0 is a local directory with no cache and no throttle.  The reader is given this
  rank's files of the epoch in order (no DALI sharding or shuffling): training builds the
  pipeline for each epoch's list, evaluation once for the rank's fixed shard.  The
  reader's "labels" are the sample indices (the class labels are looked up afterwards);
  ``pad_last_batch`` fills an evaluation pass's last batch with repeats of its last file,
  which are cut off by count, so a pass is exactly the shard and the next pass starts in
  step.  Training lists are whole batches (drop_last), so they are never padded.
* **external** - ``fn.external_source`` fed with encoded bytes from the multi-level cache
  (:mod:`bench.data.cache`), fetched by a thread pool ahead of the pipeline
  (:mod:`bench.data.dali_feed`); DALI then decodes.  With ``cache=predecoded`` the source
  gives uint8 pixels and decoding is skipped.  An epoch cut short by the training loop is
  closed before the next starts (:class:`bench.data.dali_common.ExternalEpochs`).

Both take their batches from :func:`bench.data.sampling.rank_batches`, the rule of every
loader.

Augmentation: :func:`bench.data.dali_common.augment`.  Progressive resizing: one pipeline
per training size, built when an epoch first needs it.  CIFAR-10 and the embedded digits
go through ``fn.external_source`` from arrays (:mod:`bench.data.dali_arrays`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from bench.data.cache import CachedReader, merge_stats
from bench.data.cached_folder import warn_corrupt, zero_stats
from bench.data.dali_common import (
    ExternalEpochs,
    KeepAlive,
    augment,
    dali_device_id,
    require_dali,
    to_device,
    to_torch,
    zero_copy,
)
from bench.data.dali_feed import ExternalFeed
from bench.data.jpegs import jpeg_looks_complete
from bench.data.sampling import rank_batches, steps_per_epoch
from bench.data.types import SAMPLES


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
        self.device, self.threads, self.prefetch = device, max(1, threads), max(1, prefetch)
        self.seed, self.size_at, self.flip, self.strict = seed, size_at, flip, strict
        self.device_id = dali_device_id(device, dali_device)
        self.predecode_size = predecode_size
        self.labels = np.asarray(listing.labels, dtype=np.int64)
        self.epoch = 0
        self._pipe: tuple[Any, Any] = (None, None)  # (key, built pipeline)
        self._stats: dict[str, float] = zero_stats()
        self._seen_corrupt: set[str] = set()
        self._epochs = ExternalEpochs()
        self._reader_open = False  # a file-reader pass was left unfinished
        self.feed: ExternalFeed | None = None
        if mode == "reader":
            self._good, self._paths, self._sizes = self._checked_files()
        else:
            self.feed = ExternalFeed(
                listing,
                reader,
                threads=self.threads,
                ahead=2 * self.prefetch + 1,
                predecode_size=predecode_size,
                strict=strict,
                stats=self._stats,
            )

    @property
    def fetch_threads(self) -> int:
        """Threads reading files ahead of DALI (external source); 0 for the file reader."""
        return self.feed.pool._max_workers if self.feed is not None else 0

    @property
    def _pool(self) -> Any:  # the fetch pool under its former name (input benchmark)
        return self.feed.pool if self.feed is not None else None

    # -- epochs, lengths, counters -------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        self._end_open_epoch()
        self.epoch = epoch

    def _samples(self) -> int:
        """Samples the rule deals out: the good files (reader) or the whole listing."""
        return len(self._good) if self.mode == "reader" else len(self.listing)

    def _plan(self) -> list[np.ndarray]:
        """This epoch's batches of sample indices (listing positions)."""
        plan = rank_batches(
            self._samples(),
            self.rank,
            self.world,
            self.batch_size,
            self.train,
            self.seed,
            self.epoch,
        )
        return [self._good[b] for b in plan] if self.mode == "reader" else plan

    def __len__(self) -> int:
        n = self._samples()
        return steps_per_epoch(n, self.world, self.batch_size, self.train, self.rank)

    def epoch_stats(self) -> dict[str, float]:
        if self.reader is not None:
            merge_stats(self._stats, self.reader.stats.take())
        out = dict(self._stats)
        self._stats.clear()  # the feed holds this dict: reset it in place
        self._stats.update(zero_stats())
        return out

    def close(self) -> None:
        """Free the pipeline and the fetch threads."""
        self._pipe = (None, None)
        if self.feed is not None:
            self.feed.close()

    def _end_open_epoch(self) -> None:
        """Close an epoch the training loop stopped taking batches from."""
        if self.feed is not None:
            self._epochs.finish(self.feed.stop)
        if self._reader_open:  # its pipeline has read ahead into a pass never taken
            self._pipe, self._reader_open = (None, None), False

    # -- the reader path -------------------------------------------------------------------
    def _checked_files(self) -> tuple[np.ndarray, list[str], np.ndarray]:
        """(indices, absolute paths, sizes in bytes) of the files that look like images.

        A truncated or non-image file would fail a whole DALI batch, so the files are
        checked (first and last bytes) once, in threads, and the bad ones are skipped with
        a warning (or stop the run with data.strict=true).  The paths and sizes are per
        sample index (the sizes count level 0 bytes).
        """

        paths = [os.path.join(self.local_root, f) for f in self.listing.files]

        def check(p: str) -> int:  # the size in bytes, -1 for a bad file
            try:
                size = os.path.getsize(p)
                with open(p, "rb") as f:
                    head = f.read(8)
                    f.seek(max(0, size - 64))
                    tail = f.read(64)
            except OSError:
                return -1
            return size if jpeg_looks_complete(head + tail if len(head) == 8 else head) else -1

        with ThreadPoolExecutor(8) as ex:
            sizes = np.array(list(ex.map(check, paths)), dtype=np.int64)
        bad = [self.listing.files[i] for i in np.flatnonzero(sizes < 0)]
        if bad:
            self._stats["data/corrupt"] = len(bad)
            msgs = [f"{b}: truncated or not an image" for b in bad]
            warn_corrupt(msgs, self._seen_corrupt, self.strict)
        return np.flatnonzero(sizes >= 0), paths, sizes

    def _reader_pipe(self, size: int, order: np.ndarray):
        """``fn.readers.file`` over the files ``order`` (sample indices), read in order."""
        fn, pipeline_def, types = require_dali()
        files = [self._paths[i] for i in order.tolist()]
        gpu = self.device_id is not None

        @pipeline_def
        def pipe():
            jpegs, index = fn.readers.file(
                files=files,
                labels=order.tolist(),
                random_shuffle=False,
                pad_last_batch=True,
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
            seed=self.seed + self.rank + 7919 * self.epoch,
        )

    def _run_reader(self, plan: list[np.ndarray]):
        # training: one pipeline per epoch's list; evaluation: one for the fixed shard, in
        # step pass after pass (pad_last_batch completes the last batch of each pass)
        key = ("reader", self.size_at(self.epoch), self.epoch if self.train else None)
        pipe = self._built(key, lambda: self._reader_pipe(key[1], np.concatenate(plan)))
        self._reader_open = True
        for batch in plan:
            images, index = self._run(pipe.run)
            yield images, index, batch
        self._reader_open = False

    # -- the external (cached) path --------------------------------------------------------
    def _external_pipe(self, size: int):
        fn, pipeline_def, types = require_dali()
        gpu = self.device_id is not None
        decoded = bool(self.predecode_size)

        keep = KeepAlive(2 * self.prefetch + 4)

        @pipeline_def
        def pipe():
            # the source is called ahead of run(), one batch per call; it raises
            # StopIteration after the epoch's plan (then the pipeline is reset).  no_copy:
            # DALI reads the fetched arrays (cached bytes or pixels) in place, no host
            # copy; ``keep`` holds them until the pipeline is done with them
            data, index = fn.external_source(
                source=lambda: keep(self.feed()),
                num_outputs=2,
                batch=True,
                dtype=[types.UINT8, types.INT64],
                layout=["HWC" if decoded else "", ""],
                no_copy=True,
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
            seed=self.seed + self.rank,
        )

    def _run_external(self, plan: list[np.ndarray]):
        key = ("external", self.size_at(self.epoch))
        pipe = self._built(key, lambda: self._external_pipe(key[1]))
        self.feed.start(plan)
        for images, index in self._epochs.run(pipe, self._run):
            yield images, index, None
        if self.feed.error is not None:
            raise self.feed.error

    # -- iteration ---------------------------------------------------------------------------
    def _built(self, key: tuple, make: Callable[[], Any]):
        """The pipeline for ``key``, built (and the previous one freed) when it changes."""
        if self._pipe[0] != key:
            self._pipe = (None, None)  # progressive resizing goes one way: free the old one
            pipe = make()
            pipe.build()
            self._pipe = (key, pipe)
        return self._pipe[1]

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for x, y, _ in self.iter_indexed():
            yield x, y

    def iter_indexed(self) -> Iterator[tuple[Any, Any, Any]]:
        self._end_open_epoch()
        plan = self._plan()
        if not plan:
            return
        run = self._run_reader if self.mode == "reader" else self._run_external
        t0 = time.perf_counter()
        for images, index, batch in run(plan):
            self._stats["data/wait_s"] = (
                self._stats.get("data/wait_s", 0.0) + time.perf_counter() - t0
            )
            x, idx = self._real(images, index, batch)
            y = self._to_device(self.labels[idx.numpy()])
            self._stats[SAMPLES] += len(idx)
            yield x, y, idx  # x: on self.device (to_torch)
            t0 = time.perf_counter()

    def _to_device(self, labels: np.ndarray):

        return to_device(torch.from_numpy(labels), self.device)

    def _real(self, images: Any, index: Any, batch: np.ndarray | None):
        """(images, sample indices) of a batch without the reader's padding."""

        idx = to_torch(index, torch.device("cpu")).view(-1)  # a copy: see KeepAlive
        x = to_torch(images, self.device, wrap=zero_copy(self._pipe[1]))
        if batch is None:  # external source: every sample is real
            return x, idx
        n = len(batch)  # the file reader pads the last batch of a pass: cut by count
        x, idx = x[:n], idx[:n]
        if not np.array_equal(idx.numpy(), batch):
            raise RuntimeError(f"DALI file reader out of step on rank {self.rank}")
        self._stats["cache/misses"] += n  # every file came from level 0
        self._stats["cache/bytes_l0"] += int(self._sizes[batch].sum())
        return x, idx

    def _run(self, call: Callable):
        try:
            return call()
        except RuntimeError as e:
            raise RuntimeError(
                f"DALI could not process a batch on rank {self.rank} "
                f"(run data.loader=torch to name the file): {e}"
            ) from e
