"""The multi-level data cache: remote storage -> local disk -> memory.

Levels, from slow to fast:

* level 0 - the data set's storage (:mod:`bench.data.storage`; NFS, ``s3://`` ..., or the
  slow-storage emulator);
* level 1 - :class:`DiskCache`: a local directory filled on first read and kept across
  runs.  A size cap with least-recently-used eviction (a file's mtime is its last use).
  Every file carries a header with its length and CRC-32, so a half-written or damaged
  file is never trusted: it is deleted and fetched again.  Writes go to a temporary file
  that is renamed into place (atomic on POSIX), and a per-file lock (4096 lock stripes)
  makes each file be fetched once per node even with many workers and processes.  A cache
  directory that is not writable or is full only turns level 1 off, with one warning.
* level 2 - :class:`MemoryCache`: encoded bytes under a byte cap, LRU; or, for
  ``cache=predecoded``, uint8 images decoded once at a chosen resolution, which saves the
  JPEG decode in every later epoch (and is small at the low resolutions of progressive
  resizing).

DALI's own decoder cache works only with its GPU decoder, so this cache is the project's
own and feeds both loaders: the torchvision DataLoader
(:class:`bench.data.cached_folder.CachedFolderLoader`; each worker process keeps its own
level 2, and :func:`bench.data.storage.shard_batches` gives every worker the same files
every epoch so that it hits) and DALI through ``fn.external_source`` (:mod:`bench.data.dali`).

Per-epoch numbers (``cache/hits``, ``cache/misses``, ``cache/bytes_l0`` ...) are counted in
a :class:`CacheStats` and written to the curve CSV by the training loop.
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct
import tempfile
import threading
import warnings
import zlib
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.data.jpegs import decode_resized
from bench.data.storage import Storage
from bench.registry import ConfigError, Registry

_MAGIC = b"BKC1"
_HEADER = struct.Struct("<4sQI")  # magic, payload length (bytes), CRC-32 of the payload
_STRIPES = 4096  # lock files; two files share a lock with probability 1/4096


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
    level), ``cache/refetched`` (level 1 files that failed verification),
    ``cache/evicted`` (files evicted from level 1), ``data/corrupt`` (images skipped).
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


class DiskCache:
    """Level 1: verified, atomically written, size-capped LRU files in a local directory."""

    def __init__(
        self, path: str, cap_bytes: int, namespace: str, stats: CacheStats, verify: str = "crc32"
    ) -> None:
        if verify not in ("crc32", "size"):
            raise ConfigError(f"cache.verify must be crc32 or size, not {verify!r}")
        self.root = os.path.abspath(path)
        self.cap = int(cap_bytes)
        self.verify = verify
        self.stats = stats
        # one sub-folder per data set so that two data sets never share a key
        self.dir = os.path.join(self.root, hashlib.sha1(namespace.encode()).hexdigest()[:16])
        self.lock_dir = os.path.join(self.root, ".locks")
        self.writable = True
        try:
            os.makedirs(self.dir, exist_ok=True)
            os.makedirs(self.lock_dir, exist_ok=True)
        except OSError as e:
            self._disable(e)
        self._usage = self._scan_usage() if self.writable else 0

    # -- paths and locks -------------------------------------------------------------
    def _digest(self, key: str) -> str:
        return hashlib.sha1(key.encode()).hexdigest()

    def file_for(self, key: str) -> str:
        h = self._digest(key)
        return os.path.join(self.dir, h[:2], h)

    def lock_for(self, key: str):
        from filelock import FileLock

        stripe = int(self._digest(key)[:8], 16) % _STRIPES
        return FileLock(os.path.join(self.lock_dir, f"{stripe:03x}.lock"))

    def _disable(self, e: OSError) -> None:
        if self.writable:
            why = (
                "is full"
                if e.errno in (errno.ENOSPC, errno.EDQUOT)
                else f"is not writable ({e.strerror})"
            )
            warnings.warn(
                f"cache directory {self.root!r} {why}; level 1 (disk) is off for this run, "
                "reading from the data set instead",
                stacklevel=3,
            )
        self.writable = False

    # -- read, write, evict ------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """The cached bytes, or None when absent or failing verification (then deleted)."""
        path = self.file_for(key)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError:
            return None
        data = self._check(raw)
        if data is None:
            self.stats.add("cache/refetched")
            try:
                os.unlink(path)
            except OSError:
                pass
            return None
        try:
            os.utime(path)  # mtime = last use, the LRU clock shared by all processes
        except OSError:
            pass
        return data

    def _check(self, raw: bytes) -> bytes | None:
        if len(raw) < _HEADER.size:
            return None
        magic, length, crc = _HEADER.unpack_from(raw)
        data = raw[_HEADER.size :]
        if magic != _MAGIC or len(data) != length:
            return None
        if self.verify == "crc32" and zlib.crc32(data) != crc:
            return None
        return data

    def put(self, key: str, data: bytes) -> None:
        """Write atomically (temp file + rename); errors turn level 1 off, nothing else."""
        if not self.writable or len(data) + _HEADER.size > self.cap:
            return
        path = self.file_for(key)
        tmp = None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
            with os.fdopen(fd, "wb") as f:
                f.write(_HEADER.pack(_MAGIC, len(data), zlib.crc32(data)))
                f.write(data)
            os.replace(tmp, path)
            tmp = None
        except OSError as e:
            self._disable(e)
            return
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        self._usage += len(data) + _HEADER.size
        if self._usage > self.cap:
            self.evict()

    def _entries(self) -> list[tuple[float, int, str]]:
        out = []
        for dirpath, _, names in os.walk(self.root):
            if dirpath == self.lock_dir:
                continue
            for n in names:
                if n.startswith(".tmp-") or n.startswith(".probe-"):
                    continue
                p = os.path.join(dirpath, n)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                out.append((st.st_mtime, st.st_size, p))
        return out

    def _scan_usage(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def evict(self) -> None:
        """Delete least recently used files until the directory is under 90 % of the cap.

        The cap holds for the whole directory (all data sets, all processes): the scan is
        done under one lock, and the 10 % slack keeps scans rare.
        """
        from filelock import FileLock

        with FileLock(os.path.join(self.lock_dir, "evict.lock")):
            entries = sorted(self._entries())
            total = sum(size for _, size, _ in entries)
            target = int(self.cap * 0.9)
            for _, size, p in entries:
                if total <= target:
                    break
                try:
                    os.unlink(p)
                    total -= size
                    self.stats.add("cache/evicted")
                except OSError:
                    pass
            self._usage = total

    def usage(self) -> int:
        """Bytes in the cache directory now (a scan)."""
        return self._scan_usage()


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
    """Read a file of the data set through the configured levels, counting everything."""

    def __init__(
        self,
        store: Storage,
        disk: DiskCache | None = None,
        memory: MemoryCache | None = None,
        decoded: MemoryCache | None = None,
        stats: CacheStats | None = None,
    ) -> None:
        self.store = store
        self.disk = disk
        self.memory = memory
        self.decoded = decoded
        self.stats = stats or (disk.stats if disk else CacheStats())

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
        data = disk.get(rel)
        if data is None:
            # one fetch per node: whoever holds the file's lock fetches, the others wait
            # for it and then read the verified copy
            with disk.lock_for(rel):
                data = disk.get(rel)
                if data is None:
                    data = self._fetch(rel)
                    disk.put(rel, data)
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

    def get_decoded(self, rel: str, short_side: int) -> np.ndarray:
        """uint8 HWC pixels of ``rel`` with the shorter side at ``short_side`` pixels.

        Decoded once (PIL's JPEG draft mode decodes straight at 1/2, 1/4 or 1/8 scale when
        that is still large enough), then served from the decoded level 2.  Raises
        :class:`CorruptImage` when the bytes do not decode.
        """
        key = f"{rel}@{short_side}"
        if self.decoded is not None:
            arr = self.decoded.get(key)
            if arr is not None:
                self.stats.add("cache/hits")
                self.stats.add("cache/hits_l2")
                self.stats.add("cache/bytes_l2", arr.nbytes)
                return arr
        arr = decode_resized(self._get_encoded(rel), short_side, rel)
        if self.decoded is not None:
            self.decoded.put(key, arr)
        return arr


def build_reader(
    store: Storage, cache_cfg: Any, namespace: str, memory_share: int = 1
) -> CachedReader:
    """The levels named by ``cache_cfg.name`` over ``store``.

    ``memory_share``: how many processes (loader workers) split ``cache.memory_gb``.
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
    return CachedReader(store, disk, memory, decoded, stats)


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
        raise ConfigError("cache.predecode_size must be >= 0 (0 = from data.image_size)")
