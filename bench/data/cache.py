"""The multi-level data cache: remote storage -> local disk -> memory.

Levels, from slow to fast:

* level 0 - the data set's storage (:mod:`bench.data.storage`; NFS, ``s3://`` ..., or the
  slow-storage emulator, one emulated link per node);
* level 1 - :class:`bench.data.disk_cache.DiskCache`: a local directory filled on first
  read and kept across runs, shared by every process of the node: one size cap for the
  directory (a usage ledger under a file lock, LRU eviction), verified and atomically
  written files, each tagged with its source's size and mtime so that a changed source is
  fetched again, and one fetch per file per node.  A cache directory that is not writable
  or is full only turns level 1 off, with one warning.
* level 2 - :class:`MemoryCache`: encoded bytes under a byte cap, LRU; or, for
  ``cache=predecoded``, uint8 images decoded once, which saves the JPEG decode in every
  later epoch.  Pre-decoded images keep their original resolution unless
  ``cache.predecode_size`` caps their shorter side (never upsampled), so random-resized
  crops and evaluation see the pixels the uncached path decodes; the price is memory:
  about ``width x height x 3`` bytes per image (~4x the JPEG for ImageNet-like photos),
  counted as ``cache/bytes_decoded``.

DALI's own decoder cache works only with its GPU decoder, so this cache is the project's
own and feeds both loaders: the torchvision DataLoader
(:class:`bench.data.cached_folder.CachedFolderLoader`; each worker process keeps its own
level 2, and :func:`bench.data.sampling.worker_affine` sends nearly every file to the same
worker every epoch so that it hits) and DALI through ``fn.external_source``
(:mod:`bench.data.dali`).

Per-epoch numbers (``cache/hits``, ``cache/misses``, ``cache/bytes_l0`` ...) are counted in
a :class:`CacheStats` and written to the curve CSV by the training loop.
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.data.disk_cache import DiskCache
from bench.data.jpegs import decode_capped
from bench.data.storage import Storage
from bench.registry import ConfigError, Registry

__all__ = ["CACHES", "CacheStats", "CachedReader", "DiskCache", "MemoryCache", "build_reader"]


@dataclass(frozen=True)
class Levels:
    disk: bool  # level 1: local directory
    memory: bool  # level 2: encoded bytes in memory
    decoded: bool  # level 2: uint8 pixels in memory (replaces the encoded memory level)


CACHES: Registry = Registry("cache")
for _name, _levels in {
    "none": Levels(False, False, False),
    "disk": Levels(True, False, False),
    "memory": Levels(False, True, False),
    "multilevel": Levels(True, True, False),
    "predecoded": Levels(True, False, True),
}.items():
    CACHES.register(_name)(_levels)


class CacheStats:
    """Counters of one process: hits and misses per level, bytes from each level.

    Keys: ``cache/hits`` (level 1 or 2), ``cache/hits_l1``, ``cache/hits_l2``,
    ``cache/misses`` (read from level 0), ``cache/bytes_l0|l1|l2`` (bytes served by that
    level), ``cache/refetched`` (level 1 files that failed verification or were copies
    of an older source version), ``cache/evicted`` (files evicted from level 1),
    ``cache/bytes_decoded`` (bytes of pixels added to the pre-decoded level: its memory
    cost), ``data/corrupt`` (images skipped).
    """

    def __init__(self) -> None:
        self._c: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, key: str, n: float = 1) -> None:
        with self._lock:
            self._c[key] += n

    def take(self) -> dict[str, float]:
        """The counts since the last ``take`` (then reset)."""
        with self._lock:
            out = dict(self._c)
            self._c.clear()
        return out


def merge_stats(into: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v
    return into


ZERO_STATS = {
    k: 0
    for k in (
        "cache/hits",
        "cache/misses",
        "cache/hits_l1",
        "cache/hits_l2",
        "cache/bytes_l0",
        "cache/bytes_l1",
        "cache/bytes_l2",
        "cache/refetched",
        "cache/evicted",
        "cache/bytes_decoded",
        "data/corrupt",
    )
}


def default_cache_dir() -> str:
    return os.environ.get("BENCH_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "topk-dawnbench", "data"
    )


def check_cache_dir(path: str) -> None:
    """Configuration-time check: ``path`` can be created and written (else ConfigError)."""
    try:
        os.makedirs(path, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".probe-", dir=path)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ConfigError(f"cache.dir {path!r} is not writable ({e.strerror})") from None


class MemoryCache:
    """Level 2: an LRU of byte strings or arrays under a byte cap (per process)."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap = int(cap_bytes)
        self._d: OrderedDict[str, Any] = OrderedDict()
        self.nbytes = 0
        self._lock = threading.Lock()

    @staticmethod
    def _size(v: Any) -> int:
        return v.nbytes if isinstance(v, np.ndarray) else len(v)

    def get(self, key: str) -> Any:
        with self._lock:
            v = self._d.get(key)
            if v is not None:
                self._d.move_to_end(key)
            return v

    def put(self, key: str, value: Any) -> None:
        n = self._size(value)
        if n > self.cap:
            return
        with self._lock:
            old = self._d.pop(key, None)
            if old is not None:
                self.nbytes -= self._size(old)
            self._d[key] = value
            self.nbytes += n
            while self.nbytes > self.cap:
                _, ev = self._d.popitem(last=False)
                self.nbytes -= self._size(ev)

    def __len__(self) -> int:
        return len(self._d)


class CachedReader:
    """Read a file of the data set through the configured levels, counting everything.

    ``predecode_max``: cap (pixels) on the shorter side of pre-decoded images, 0 = the
    original resolution; None = the ``short_side`` each :meth:`get_decoded` call gives.
    """

    def __init__(
        self,
        store: Storage,
        disk: DiskCache | None = None,
        memory: MemoryCache | None = None,
        decoded: MemoryCache | None = None,
        stats: CacheStats | None = None,
        predecode_max: int | None = None,
    ) -> None:
        self.store = store
        self.disk = disk
        self.memory = memory
        self.decoded = decoded
        self.stats = stats or (disk.stats if disk else CacheStats())
        self.predecode_max = predecode_max

    def get(self, rel: str) -> bytes:
        """The encoded bytes of ``rel`` (a path relative to the data set root)."""
        st = self.stats
        if self.memory is not None:
            data = self.memory.get(rel)
            if data is not None:
                st.add("cache/hits")
                st.add("cache/hits_l2")
                st.add("cache/bytes_l2", len(data))
                return data
        data = self._get_encoded(rel)
        if self.memory is not None:
            self.memory.put(rel, data)
        return data

    def _get_encoded(self, rel: str) -> bytes:
        st = self.stats
        disk = self.disk
        if disk is None or not disk.writable:
            return self._fetch(rel)
        # the source's (size, mtime): a copy of an older version is refetched
        version_of = getattr(self.store, "version", None)
        version = version_of(rel) if version_of else None
        data = disk.get(rel, version)
        if data is None:
            # one fetch per node: whoever holds the file's lock fetches, the others wait
            # for it and then read the verified copy
            with disk.lock_for(rel):
                data = disk.get(rel, version)
                if data is None:
                    data = self._fetch(rel)
                    disk.put(rel, data, version)
                    return data
        st.add("cache/hits")
        st.add("cache/hits_l1")
        st.add("cache/bytes_l1", len(data))
        return data

    def _fetch(self, rel: str) -> bytes:
        data = self.store.read(rel)
        self.stats.add("cache/misses")
        self.stats.add("cache/bytes_l0", len(data))
        return data

    def get_decoded(self, rel: str, short_side: int | None = None) -> np.ndarray:
        """uint8 HWC pixels of ``rel``, decoded once and then served from the decoded level.

        The shorter side is capped at ``predecode_max`` pixels (0 = the original
        resolution, decoded exactly as :func:`bench.data.jpegs.decode_rgb` does); a reader
        made without a cap (``predecode_max=None``) caps at ``short_side`` instead.  Images
        are never upsampled.  Raises :class:`CorruptImage` when the bytes do not decode.
        """
        cap = self.predecode_max if self.predecode_max is not None else int(short_side or 0)
        key = f"{rel}@{cap}"
        if self.decoded is not None:
            arr = self.decoded.get(key)
            if arr is not None:
                self.stats.add("cache/hits")
                self.stats.add("cache/hits_l2")
                self.stats.add("cache/bytes_l2", arr.nbytes)
                return arr
        arr = decode_capped(self._get_encoded(rel), cap, rel)
        if self.decoded is not None:
            self.decoded.put(key, arr)
            self.stats.add("cache/bytes_decoded", arr.nbytes)
        return arr


def build_reader(
    store: Storage, cache_cfg: Any, namespace: str, memory_share: int = 1
) -> CachedReader:
    """The levels named by ``cache_cfg.name`` over ``store``.

    ``memory_share``: how many processes (loader workers) split ``cache.memory_gb``.
    Pre-decoded images are capped at ``cache.predecode_size`` pixels (0 = original size).
    """
    levels: Levels = CACHES.get(cache_cfg.name)
    stats = CacheStats()
    disk = None
    if levels.disk:
        disk = DiskCache(
            cache_cfg.dir or default_cache_dir(),
            int(cache_cfg.disk_gb * 1e9),
            namespace,
            stats,
            cache_cfg.verify,
        )
    mem_cap = int(cache_cfg.memory_gb * 1e9 / max(1, memory_share))
    memory = MemoryCache(mem_cap) if levels.memory else None
    decoded = MemoryCache(mem_cap) if levels.decoded else None
    cap = int(cache_cfg.predecode_size)
    return CachedReader(store, disk, memory, decoded, stats, predecode_max=cap)


def validate_cache(cache_cfg: Any) -> None:
    """Configuration-time checks of the ``cache`` group (ConfigError on bad values)."""
    levels: Levels = CACHES.get(cache_cfg.name)
    if cache_cfg.verify not in ("crc32", "size"):
        raise ConfigError(f"cache.verify must be crc32 or size, not {cache_cfg.verify!r}")
    if levels.disk:
        if cache_cfg.disk_gb <= 0:
            raise ConfigError("cache.disk_gb must be > 0 for a cache with a disk level")
        check_cache_dir(cache_cfg.dir or default_cache_dir())
    if (levels.memory or levels.decoded) and cache_cfg.memory_gb <= 0:
        raise ConfigError("cache.memory_gb must be > 0 for a cache with a memory level")
    if cache_cfg.predecode_size < 0:
        raise ConfigError(
            "cache.predecode_size must be >= 0 (a cap on the shorter side in pixels; "
            "0 = the original resolution)"
        )
