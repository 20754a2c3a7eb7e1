"""The feed of DALI's ``fn.external_source`` for image folders: cached reads ahead of DALI.

:class:`ExternalFeed` is the source callback of :class:`bench.data.dali.DaliFolderLoader`
in ``external`` mode.  For one epoch's batch plan (:func:`bench.data.sampling.rank_batches`)
it reads the files of the next few batches through a :class:`bench.data.cache.CachedReader`
in a thread pool, so level 0 latency overlaps DALI's decoding; DALI calls it once per
batch and it raises StopIteration after the plan's last batch.  Corrupt images are
skipped with a warning (``data.strict=true``: the first one ends the epoch with an error).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from bench.data.cache import CachedReader
from bench.data.cached_folder import warn_corrupt
from bench.data.jpegs import CorruptImage, jpeg_looks_complete


class ExternalFeed:
    """Encoded bytes (or pre-decoded uint8 pixels) of one epoch's batches, fetched ahead."""

    def __init__(
        self,
        listing: Any,
        reader: CachedReader,
        *,
        threads: int,
        ahead: int,
        predecode_size: int,
        strict: bool,
        stats: dict[str, float],
    ) -> None:
        self.listing, self.reader, self.predecode_size = listing, reader, predecode_size
        self.strict, self.stats, self.ahead = strict, stats, ahead  # ahead: batches in flight
        self.pool = ThreadPoolExecutor(threads * 2)
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

    def __call__(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """external_source's callback: the next fetched batch with at least one good image."""

        while self.futs:
            data, index, bad = self._gather(self.futs.pop(0))
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
