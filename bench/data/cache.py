"""The multi-level data cache: storage (level 0) -> local disk (level 1) -> memory (level 2).

Level 1 is a size-capped LRU directory shared by the processes of a node; level 2 holds
encoded bytes or decoded pixels per process; see docs/internals/data.md.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import struct
import tempfile
import threading
import warnings
import zlib
from collections import Counter, OrderedDict
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
from filelock import FileLock

from bench.data.jpegs import decode_capped
from bench.data.loaders import SAMPLES
from bench.data.storage import SharedValue, Storage
from bench.registry import ConfigError


@dataclass(frozen=True)
class Levels:
    disk: bool  # level 1: local directory
    memory: bool  # level 2: encoded bytes in memory
    decoded: bool  # level 2: uint8 pixels in memory (replaces the encoded memory level)


CACHES: dict[str, Levels] = {
    "none": Levels(False, False, False),
    "disk": Levels(True, False, False),
    "memory": Levels(False, True, False),
    "multilevel": Levels(True, True, False),
    "predecoded": Levels(True, False, True),
}


def levels(name: str) -> Levels:
    """The levels of the cache ``name`` (ConfigError naming the choices when unknown)."""
    if name not in CACHES:
        raise ConfigError(f"unknown cache {name!r}; choose one of: {', '.join(sorted(CACHES))}")
    return CACHES[name]


class CacheStats:
    """Counters of one process (``cache/hits`` ...: docs/internals/data.md), thread-safe."""

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


_COUNTS = "hits misses hits_l1 hits_l2 bytes_l0 bytes_l1 bytes_l2 refetched evicted bytes_decoded"


def zero_stats() -> dict[str, float]:
    """A loader's per-epoch counters at the start of an epoch."""
    return dict.fromkeys([*(f"cache/{k}" for k in _COUNTS.split()), "data/corrupt", SAMPLES], 0)


_INSPECT_ONLY: ContextVar[bool] = ContextVar("inspect_only", default=False)


@contextlib.contextmanager
def inspect_only() -> Iterator[None]:
    """Within it the data checks look at the files a run would create (cache directory,
    embedded corpus, tokenizer) and create none of them (``--dry-run``)."""
    token = _INSPECT_ONLY.set(True)
    try:
        yield
    finally:
        _INSPECT_ONLY.reset(token)


def inspecting() -> bool:  # within inspect_only()
    return _INSPECT_ONLY.get()


def default_cache_dir() -> str:
    return os.environ.get("BENCH_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "topk-dawnbench", "data"
    )


def check_cache_dir(path: str) -> None:
    """Configuration-time check: ``path`` can be created and written (else ConfigError);
    within :func:`inspect_only` its nearest existing folder is inspected, nothing made."""
    if inspecting():
        base = os.path.abspath(path)
        while not os.path.exists(base) and os.path.dirname(base) != base:
            base = os.path.dirname(base)
        if not os.path.isdir(base) or not os.access(base, os.W_OK | os.X_OK):
            raise ConfigError(
                f"cache.dir {path!r} is not writable ({base} is not a writable folder)"
            )
        return
    try:
        os.makedirs(path, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".probe-", dir=path)
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ConfigError(f"cache.dir {path!r} is not writable ({e.strerror})") from None


_MAGIC = b"BKC2"
# magic, payload length (bytes), CRC-32 of the payload, source size (bytes), source mtime (ns)
_HEADER = struct.Struct("<4sQIQq")
_STRIPES = 4096  # lock files; two files share a lock with probability 1/4096
_SLACK = 0.9  # eviction frees the directory down to this fraction of the cap


class DiskCache:
    """Level 1: a size-capped LRU directory shared by the node's processes; ``stats`` counts
    ``cache/refetched`` and ``cache/evicted``."""

    def __init__(
        self, path: str, cap_bytes: int, namespace: str, stats: Any, verify: str = "crc32"
    ) -> None:
        if verify not in ("crc32", "size"):
            raise ConfigError(f"cache.verify must be crc32 or size, not {verify!r}")
        self.root, self.cap = os.path.abspath(path), int(cap_bytes)
        self.verify, self.stats = verify, stats
        # one sub-folder per data set so that two data sets never share a key
        self.dir = os.path.join(self.root, hashlib.sha1(namespace.encode()).hexdigest()[:16])
        self.lock_dir = os.path.join(self.root, ".locks")
        # bytes held by the directory (-1 until the first process has scanned it)
        self.ledger = SharedValue(os.path.join(self.root, ".usage"), "<q", -1)
        self.writable = True
        try:
            os.makedirs(self.dir, exist_ok=True)
            os.makedirs(self.lock_dir, exist_ok=True)
            with self._usage():  # the first process of the node builds the ledger
                pass
        except OSError as e:
            self._disable(e)

    def file_for(self, key: str) -> str:
        h = hashlib.sha1(key.encode()).hexdigest()
        return os.path.join(self.dir, h[:2], h)

    def lock_for(self, key: str):
        stripe = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16) % _STRIPES
        return FileLock(os.path.join(self.lock_dir, f"{stripe:03x}.lock"))

    @contextlib.contextmanager
    def _usage(self) -> Iterator[list[int]]:
        """The ledger, locked: ``[bytes held]``; a missing ledger is rebuilt by a scan."""
        with self.ledger.locked() as box:
            if box[0] < 0:
                box[0] = self._scan_usage()
            yield box

    def _disable(self, e: OSError) -> None:
        if self.writable:
            full = e.errno in (errno.ENOSPC, errno.EDQUOT)
            why = "is full" if full else f"is not writable ({e.strerror})"
            warnings.warn(
                f"cache directory {self.root!r} {why}; level 1 (disk) is off for this run, "
                "reading from the data set instead",
                stacklevel=3,
            )
        self.writable = False

    def get(self, key: str, version: tuple[int, int] | None = None) -> bytes | None:
        """The cached bytes, or None when absent, damaged or of another source ``version``
        (then deleted; None skips the version check)."""
        path = self.file_for(key)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError:
            return None
        data = self._check(raw, version)
        if data is None:
            self.stats.add("cache/refetched")
            self._remove(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # mtime = last use, the LRU clock shared by all processes
        return data

    def _check(self, raw: bytes, version: tuple[int, int] | None) -> bytes | None:
        if len(raw) < _HEADER.size:
            return None
        magic, length, crc, src_size, src_mtime = _HEADER.unpack_from(raw)
        data = raw[_HEADER.size :]
        if magic != _MAGIC or len(data) != length:
            return None
        if version is not None and (src_size, src_mtime) != tuple(version):
            return None
        if self.verify == "crc32" and zlib.crc32(data) != crc:
            return None
        return data

    def _remove(self, path: str) -> None:
        if not self.writable:
            return
        with contextlib.suppress(OSError), self._usage() as used:
            size = os.stat(path).st_size
            os.unlink(path)
            used[0] = max(0, used[0] - size)

    def put(self, key: str, data: bytes, version: tuple[int, int] | None = None) -> None:
        """Store ``data`` (of source ``version``) atomically under the cap (larger data is not
        stored; errors turn level 1 off)."""
        size = len(data) + _HEADER.size
        if not self.writable or size > self.cap:
            return
        path = self.file_for(key)
        src_size, src_mtime = version or (0, 0)
        header = _HEADER.pack(_MAGIC, len(data), zlib.crc32(data), src_size, src_mtime)
        tmp = None
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
            with os.fdopen(fd, "wb") as f:
                f.write(header)
                f.write(data)
            with self._usage() as used:
                if used[0] - _size_of(path) + size > self.cap:
                    used[0] = self._evict(int(self.cap * _SLACK) - size)
                old = _size_of(path)
                os.replace(tmp, path)
                tmp = None
                used[0] += size - old
        except OSError as e:
            self._disable(e)
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def _entries(self) -> list[tuple[float, int, str]]:
        """(mtime, size, path) of every cached file, all data sets (hidden files excluded)."""
        out = []
        for dirpath, dirs, names in os.walk(self.root):
            dirs[:] = [d for d in dirs if not d.startswith(".")]  # .locks
            for n in names:
                if n.startswith("."):  # .usage, .tmp-*, .probe-*
                    continue
                p = os.path.join(dirpath, n)
                with contextlib.suppress(OSError):
                    st = os.stat(p)
                    out.append((st.st_mtime, st.st_size, p))
        return out

    def _scan_usage(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def _evict(self, target: int) -> int:
        """Delete least recently used files until at most ``target`` bytes remain (called
        with the ledger locked); returns the bytes that remain."""
        entries = sorted(self._entries())
        total = sum(size for _, size, _ in entries)
        for _, size, p in entries:
            if total <= target:
                break
            with contextlib.suppress(OSError):
                os.unlink(p)
                total -= size
                self.stats.add("cache/evicted")
        return total

    def usage(self) -> int:
        """Bytes in the cache directory now (a scan, under the ledger's lock)."""
        with self.ledger.locked():
            return self._scan_usage()


def _size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class MemoryCache:
    """Level 2: an LRU of byte strings or arrays under a byte cap (per process)."""

    def __init__(self, cap_bytes: int) -> None:
        self.cap, self.nbytes, self._lock = int(cap_bytes), 0, threading.Lock()
        self._d: OrderedDict[str, Any] = OrderedDict()

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


class CachedReader:
    """Read a file of the data set through the configured levels, counting everything;
    ``predecode_max`` caps pre-decoded images' shorter side (0 = original, None = per call)."""

    def __init__(
        self,
        store: Storage,
        disk: DiskCache | None = None,
        memory: MemoryCache | None = None,
        decoded: MemoryCache | None = None,
        stats: CacheStats | None = None,
        predecode_max: int | None = None,
    ) -> None:
        self.store, self.disk, self.memory, self.decoded = store, disk, memory, decoded
        self.stats = stats or (disk.stats if disk else CacheStats())
        self.predecode_max = predecode_max

    def _hit(self, level: str, nbytes: int) -> None:
        self.stats.add("cache/hits")
        self.stats.add(f"cache/hits_{level}")
        self.stats.add(f"cache/bytes_{level}", nbytes)

    def get(self, rel: str) -> bytes:
        """The encoded bytes of ``rel`` (a path relative to the data set root)."""
        data = self.memory.get(rel) if self.memory is not None else None
        if data is not None:
            self._hit("l2", len(data))
            return data
        data = self._get_encoded(rel)
        if self.memory is not None:
            self.memory.put(rel, data)
        return data

    def _get_encoded(self, rel: str) -> bytes:
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
        self._hit("l1", len(data))
        return data

    def _fetch(self, rel: str) -> bytes:
        data = self.store.read(rel)
        self.stats.add("cache/misses")
        self.stats.add("cache/bytes_l0", len(data))
        return data

    def get_decoded(self, rel: str, short_side: int | None = None) -> np.ndarray:
        """uint8 HWC pixels of ``rel``, decoded once (shorter side capped, never upsampled) and then
        served from the decoded level; :class:`CorruptImage` when the bytes do not decode."""
        cap = self.predecode_max if self.predecode_max is not None else int(short_side or 0)
        key = f"{rel}@{cap}"
        arr = self.decoded.get(key) if self.decoded is not None else None
        if arr is not None:
            self._hit("l2", arr.nbytes)
            return arr
        arr = decode_capped(self._get_encoded(rel), cap, rel)
        if self.decoded is not None:
            self.decoded.put(key, arr)
            self.stats.add("cache/bytes_decoded", arr.nbytes)
        return arr


def build_reader(
    store: Storage, cache_cfg: Any, namespace: str, memory_share: int = 1
) -> CachedReader:
    """The levels named by ``cache_cfg.name`` over ``store``; ``memory_share``: how many
    processes (loader workers) split ``cache.memory_gb``."""
    lv = levels(cache_cfg.name)
    stats = CacheStats()
    disk = None
    if lv.disk:
        cap = int(cache_cfg.disk_gb * 1e9)
        disk = DiskCache(
            cache_cfg.dir or default_cache_dir(), cap, namespace, stats, cache_cfg.verify
        )
    mem_cap = int(cache_cfg.memory_gb * 1e9 / max(1, memory_share))
    memory = MemoryCache(mem_cap) if lv.memory else None
    decoded = MemoryCache(mem_cap) if lv.decoded else None
    return CachedReader(store, disk, memory, decoded, stats, int(cache_cfg.predecode_size))


def validate_cache(cache_cfg: Any) -> None:
    """Configuration-time checks of the ``cache`` group (ConfigError on bad values)."""
    lv = levels(cache_cfg.name)
    if cache_cfg.verify not in ("crc32", "size"):
        raise ConfigError(f"cache.verify must be crc32 or size, not {cache_cfg.verify!r}")
    if lv.disk:
        if cache_cfg.disk_gb <= 0:
            raise ConfigError("cache.disk_gb must be > 0 for a cache with a disk level")
        check_cache_dir(cache_cfg.dir or default_cache_dir())
    if (lv.memory or lv.decoded) and cache_cfg.memory_gb <= 0:
        raise ConfigError("cache.memory_gb must be > 0 for a cache with a memory level")
    if cache_cfg.predecode_size < 0:
        raise ConfigError(
            "cache.predecode_size must be >= 0 (a cap on the shorter side in pixels; "
            "0 = the original resolution)"
        )
