"""Evict files from the operating system's page cache, and measure how much of a file is in it.

An input benchmark that reads the same files every epoch measures memory, not storage,
once the kernel has cached them: "no cache" would then be a page-cache read.
:func:`drop_page_cache` asks the kernel to drop the clean cached pages of the given files
(``fsync`` then ``posix_fadvise(POSIX_FADV_DONTNEED)``, which needs no root rights; pages
that another process keeps mapped stay), so the next read goes to the disk.
:func:`resident_fraction` checks it with ``mincore(2)`` (Linux): the fraction of a file's
pages in the page cache.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable

_PROT_READ, _MAP_SHARED = 1, 1


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
    """Drop the cached pages of these files (and of the files below these folders).

    Returns the number of files advised; files that vanished meanwhile are skipped.  A no-op
    (returning 0) where ``posix_fadvise`` does not exist.
    """
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


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long,
    ]  # fmt: skip
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def resident_fraction(paths: Iterable[str]) -> float:
    """Fraction (0..1) of the pages of these files that are in the page cache now (mincore)."""
    libc = _libc()
    page = os.sysconf("SC_PAGE_SIZE")
    total = resident = 0
    for path in _files(paths):
        size = os.path.getsize(path)
        if not size:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, _PROT_READ, _MAP_SHARED, fd, 0)
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
