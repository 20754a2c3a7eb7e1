"""Level 0 of the data cache: a local folder or an fsspec URL, optionally behind a
slow-storage emulator; class-folder listings, and the page-cache tools of the input
benchmark (docs/internals/data.md)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import mmap
import os
import struct
import tempfile
import threading
import time
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from bench.registry import ConfigError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".JPEG", ".JPG", ".PNG")

Version = tuple[int, int]  # (size in bytes, modification time in ns; 0 where unknown)


class Storage(Protocol):
    """What the cache needs from level 0, paths relative to ``root``: ``listdir`` gives
    (name, is_dir) sorted by name, ``version`` None when the storage cannot tell."""

    root: str

    def read(self, rel: str) -> bytes: ...
    def listdir(self, rel: str = "") -> list[tuple[str, bool]]: ...
    def exists(self, rel: str = "") -> bool: ...
    def version(self, rel: str) -> Version | None: ...


class LocalStorage:
    """A directory on a local disk or a mounted network file system."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(os.path.expanduser(root))

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def read(self, rel: str) -> bytes:
        with open(self.path(rel), "rb") as f:
            return f.read()

    def listdir(self, rel: str = "") -> list[tuple[str, bool]]:
        with os.scandir(self.path(rel)) as it:
            return sorted((e.name, e.is_dir()) for e in it)

    def exists(self, rel: str = "") -> bool:
        return os.path.exists(self.path(rel))

    def version(self, rel: str) -> Version | None:
        # a stat: microseconds on a local disk, served from the attribute cache on NFS
        try:
            st = os.stat(self.path(rel))
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns


class FsspecStorage:
    """Any fsspec file system given as a URL (``s3://bucket/prefix``)."""

    def __init__(self, url: str) -> None:
        try:
            # deferred: fsspec only for remote storage
            import fsspec
        except ImportError:
            raise ConfigError(
                f"data.root {url!r} is a URL, which needs fsspec: pip install fsspec "
                "(plus s3fs/gcsfs for s3:// or gs://)"
            ) from None
        try:
            self.fs, path = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as e:
            raise ConfigError(f"cannot open data.root {url!r}: {e}") from None
        self.url = url
        self.root = path.rstrip("/")
        # versions seen in listings, so that a cache hit costs no metadata request
        self._versions: dict[str, Version] = {}

    def _p(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def read(self, rel: str) -> bytes:
        return self.fs.cat_file(self._p(rel))

    def listdir(self, rel: str = "") -> list[tuple[str, bool]]:
        out = []
        for e in self.fs.ls(self._p(rel), detail=True):
            name = e["name"].rstrip("/").rsplit("/", 1)[-1]
            out.append((name, e["type"] == "directory"))
            if e["type"] != "directory":
                self._versions[f"{rel}/{name}" if rel else name] = _fsspec_version(e)
        return sorted(out)

    def exists(self, rel: str = "") -> bool:
        return self.fs.exists(self._p(rel))

    def version(self, rel: str) -> Version | None:
        v = self._versions.get(rel)
        if v is None:
            try:
                v = _fsspec_version(self.fs.info(self._p(rel)))
            except (OSError, FileNotFoundError):
                return None
        return v


def _fsspec_version(info: dict) -> Version:
    """(size, a number that changes when the object changes) from an fsspec info dict."""
    stamp = info.get("mtime") or info.get("LastModified") or info.get("ETag") or info.get("created")
    if hasattr(stamp, "timestamp"):
        tag = int(stamp.timestamp() * 1e9)
    elif isinstance(stamp, (int, float)):
        tag = int(stamp * 1e9)
    else:  # an ETag or another string: a stable 63-bit hash of it
        tag = int(hashlib.sha1(str(stamp).encode()).hexdigest()[:15], 16) if stamp else 0
    return int(info.get("size") or 0), tag


def link_path(root: str, bandwidth_mbps: float, latency_ms: float) -> str:
    """The link file of this node (``GROUP_RANK``: emulated nodes sharing a host get one link
    each) for a storage root and throttle, in ``$BENCH_LINK_DIR``, /dev/shm or the temp dir."""
    node = os.environ.get("GROUP_RANK", "0")
    key = json.dumps([root, float(bandwidth_mbps), float(latency_ms), node])
    shm = "/dev/shm"  # memory-backed and emptied at boot, so no stale clock survives a reboot
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()
    folder = os.environ.get("BENCH_LINK_DIR") or os.path.join(base, "topk-dawnbench-links")
    return os.path.join(folder, hashlib.sha1(key.encode()).hexdigest()[:16] + ".link")


class SharedValue:
    """A ``struct`` value (format ``fmt``) in the file ``path`` (``default`` when new), shared by
    every process and thread of a machine under ``flock``; each thread of each process opens
    the file itself, since ``flock`` excludes per open file."""

    def __init__(self, path: str, fmt: str, default: float) -> None:
        self.path, self.fmt, self.default = path, fmt, default
        self._struct = struct.Struct(fmt)
        self._local = threading.local()

    def _fd(self) -> int:
        loc = self._local
        if getattr(loc, "pid", None) != os.getpid():
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            loc.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            loc.pid = os.getpid()
        return loc.fd

    @contextlib.contextmanager
    def locked(self) -> Iterator[list]:
        """Hold the lock; yields ``[value]`` (``default`` when the file is new or short)
        and writes back whatever the caller left in it."""
        fd = self._fd()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            raw = os.pread(fd, self._struct.size, 0)
            ok = len(raw) == self._struct.size
            box = [self._struct.unpack(raw)[0] if ok else self.default]
            yield box
            os.pwrite(fd, self._struct.pack(box[0]), 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def __reduce__(self) -> tuple:  # pickled without the open files
        return SharedValue, (self.path, self.fmt, self.default)


_STALE_S = 3600.0  # a link booked further ahead than this is a leftover, not real traffic


class ThrottledStorage:
    """A storage whose reads take as long as the emulated storage's would: a latency per
    file (ms), and a bandwidth (MB/s) shared by every process of the node, whose link is
    next free at the ``time.monotonic()`` in the ``link`` file (one clock per host)."""

    def __init__(self, inner: Storage, bandwidth_mbps: float, latency_ms: float, link: str):
        if bandwidth_mbps < 0 or latency_ms < 0:
            raise ConfigError("the storage throttle needs a bandwidth and a latency >= 0")
        self.inner, self.root = inner, inner.root
        self.bandwidth = bandwidth_mbps * 1e6  # bytes per second; 0 = unlimited
        self.latency = latency_ms / 1e3  # seconds per file
        self.busy = SharedValue(link, "<d", 0.0)

    def read(self, rel: str) -> bytes:
        t0 = time.monotonic()
        data = self.inner.read(rel)
        if self.latency:
            time.sleep(max(0.0, t0 + self.latency - time.monotonic()))
        if self.bandwidth:  # book the transfer after every earlier booking of the link
            with self.busy.locked() as box:
                now = time.monotonic()
                busy = box[0] if box[0] <= now + _STALE_S else 0.0
                box[0] = max(now, busy) + len(data) / self.bandwidth
            time.sleep(max(0.0, box[0] - time.monotonic()))
        return data

    def __getattr__(self, name: str):  # listdir, exists, version: the inner storage's
        if name == "inner":  # not set yet (unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)


def is_url(root: str) -> bool:
    return "://" in root and not root.startswith("file://")


def open_storage(root: str, bandwidth_mbps: float = 0.0, latency_ms: float = 0.0) -> Storage:
    """Level 0 for ``root`` (a path or an fsspec URL), throttled when asked to (one
    emulated link per node, see :func:`link_path`)."""
    if not root:
        raise ConfigError("data.root is empty; set it to the data set directory or URL")
    if root.startswith("file://"):
        root = root[len("file://") :]
    store: Storage = FsspecStorage(root) if is_url(root) else LocalStorage(root)
    if not (bandwidth_mbps or latency_ms):
        return store
    link = link_path(store.root, bandwidth_mbps, latency_ms)  # one link per node
    return ThrottledStorage(store, bandwidth_mbps, latency_ms, link)


@dataclass
class FolderListing:
    """The files of one split of an ImageNet-style folder, in a fixed (sorted) order."""

    files: list[str]  # paths relative to the storage root, e.g. "train/n01440764/x.JPEG"
    labels: list[int]  # class index of each file
    classes: list[str]  # class folder names; the index is the label

    def __len__(self) -> int:
        return len(self.files)


def list_folder(store: Storage, split: str, classes: list[str] | None = None) -> FolderListing:
    """List ``<root>/<split>/<class>/<image>``, classes sorted by name (``classes`` fixes the
    list); a missing root or split is a ConfigError, an empty class folder a warning."""
    where = os.path.join(store.root, split)
    if not store.exists(""):
        raise ConfigError(f"data.root {store.root!r} does not exist")
    if not store.exists(split):
        raise ConfigError(f"data set split folder {where!r} does not exist")
    found = {name for name, is_dir in store.listdir(split) if is_dir and not name.startswith(".")}
    classes = sorted(found) if classes is None else classes
    if not classes:
        raise ConfigError(f"{where!r} has no class folders (expected <class>/<image>.jpg)")
    files: list[str] = []
    labels: list[int] = []
    empty = []
    for label, cls in enumerate(classes):
        entries = store.listdir(f"{split}/{cls}") if cls in found else []
        names = [n for n, is_dir in entries if not is_dir and n.endswith(IMAGE_EXTENSIONS)]
        if not names:
            empty.append(cls)
        files += [f"{split}/{cls}/{n}" for n in names]
        labels += [label] * len(names)
    if empty:
        shown = ", ".join(empty[:5]) + (" ..." if len(empty) > 5 else "")
        msg = f"{len(empty)} class folder(s) under {where!r} hold no images: {shown}"
        warnings.warn(msg, stacklevel=2)
    if not files:
        raise ConfigError(f"no images (.jpg/.jpeg/.png) found under {where!r}")
    return FolderListing(files, labels, list(classes))


def _files(paths: Iterable[str]) -> Iterable[str]:
    """Files among ``paths``, and every file below the folders among them."""
    for p in paths:
        if os.path.isdir(p):
            for dirpath, _, names in os.walk(p):
                for n in names:
                    yield os.path.join(dirpath, n)
        else:
            yield p


def drop_page_cache(paths: Iterable[str]) -> int:
    """Drop the cached pages of these files and folders (``fsync`` + ``posix_fadvise``);
    returns the number of files advised (0 where ``posix_fadvise`` does not exist)."""
    if not hasattr(os, "posix_fadvise"):
        return 0
    n = 0
    for path in _files(paths):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)  # dirty pages are never dropped: write them back first (a no-op if clean)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        except OSError:
            pass
        finally:
            os.close(fd)
    return n


def resident_fraction(paths: Iterable[str]) -> float:
    """Fraction (0..1) of the pages of these files that are in the page cache now (``mincore``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
    ]  # fmt: skip
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    page = os.sysconf("SC_PAGE_SIZE")
    total = resident = 0
    for path in _files(paths):
        size = os.path.getsize(path)
        if not size:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"mmap failed for {path}")
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            try:
                if libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore failed for {path}")
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
        total += pages
        resident += sum(v & 1 for v in vec)
    return resident / total if total else 0.0
