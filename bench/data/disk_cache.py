"""Level 1 of the data cache: verified, size-capped, LRU files in a local directory.

The directory is shared by every process of the node (all ranks, all loader workers) and
kept across runs.  What makes that safe:

* **One cap for the directory.**  A usage ledger (``<dir>/.usage``: the bytes held, one
  int64) is read and updated under an exclusive ``flock`` by every write; a write that
  would pass the cap first evicts the least recently used files (a file's mtime is its
  last use) by a scan done under the same lock, down to 90 % of the cap (the slack keeps
  scans rare).  The file is renamed into place under that lock too, so the bytes on disk
  never exceed the cap, whatever the number of writers.  The tree is scanned once per node
  (by the first process that finds no ledger) and then only to evict.
* **Atomic, verified files.**  A file is written to a temporary name and renamed into
  place (atomic on POSIX).  Its header holds the payload length and CRC-32, so a
  half-written or damaged file is deleted and fetched again, never trusted.
* **The source's version.**  The header also holds the source file's size and mtime
  (:meth:`bench.data.storage.Storage.version`); a copy of an older version is fetched again.
* **One fetch per file per node.**  :meth:`DiskCache.lock_for` gives a per-file lock (4096
  lock stripes); the reader fetches under it, so the other processes wait and then read
  the copy.
* A directory that is not writable, or full, turns level 1 off with one warning.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import struct
import tempfile
import warnings
import zlib
from collections.abc import Iterator
from typing import Any

from filelock import FileLock

from bench.data.shared_file import SharedValue
from bench.registry import ConfigError

_MAGIC = b"BKC2"
# magic, payload length (bytes), CRC-32 of the payload, source size (bytes), source mtime (ns)
_HEADER = struct.Struct("<4sQIQq")
_STRIPES = 4096  # lock files; two files share a lock with probability 1/4096
_SLACK = 0.9  # eviction frees the directory down to this fraction of the cap


def usage_ledger(path: str) -> SharedValue:
    """Bytes held by a level 1 directory (-1 until the first process has scanned it)."""
    return SharedValue(path, "<q", -1)


class DiskCache:
    """Level 1 (see the module docstring).  ``stats`` counts ``cache/refetched`` (a copy
    that failed verification or was of an older source version) and ``cache/evicted``."""

    def __init__(
        self, path: str, cap_bytes: int, namespace: str, stats: Any, verify: str = "crc32"
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
        self.ledger = usage_ledger(os.path.join(self.root, ".usage"))
        self.writable = True
        try:
            os.makedirs(self.dir, exist_ok=True)
            os.makedirs(self.lock_dir, exist_ok=True)
            with self._usage():  # the first process of the node builds the ledger
                pass
        except OSError as e:
            self._disable(e)

    # -- paths, locks, the ledger --------------------------------------------------------
    def _digest(self, key: str) -> str:
        return hashlib.sha1(key.encode()).hexdigest()

    def file_for(self, key: str) -> str:
        h = self._digest(key)
        return os.path.join(self.dir, h[:2], h)

    def lock_for(self, key: str):

        stripe = int(self._digest(key)[:8], 16) % _STRIPES
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

    # -- read --------------------------------------------------------------------------------
    def get(self, key: str, version: tuple[int, int] | None = None) -> bytes | None:
        """The cached bytes, or None when absent, damaged or of another source ``version``
        (then deleted).  ``version=None`` skips the version check."""
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
        try:
            os.utime(path)  # mtime = last use, the LRU clock shared by all processes
        except OSError:
            pass
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

    # -- write, evict ------------------------------------------------------------------------
    def put(self, key: str, data: bytes, version: tuple[int, int] | None = None) -> None:
        """Store ``data`` (of source ``version``) atomically under the directory's cap.

        Errors turn level 1 off, nothing else.  Data larger than the cap is not stored.
        """
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
                try:
                    st = os.stat(p)
                except OSError:
                    continue
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
            try:
                os.unlink(p)
                total -= size
                self.stats.add("cache/evicted")
            except OSError:
                pass
        return total

    def evict(self) -> None:
        """Evict down to 90 % of the cap now."""
        with self._usage() as used:
            used[0] = self._evict(int(self.cap * _SLACK))

    def usage(self) -> int:
        """Bytes in the cache directory now (a scan, under the ledger's lock)."""
        with self.ledger.locked():
            return self._scan_usage()


def _size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
