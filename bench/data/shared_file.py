"""One number in a file, shared by every process and thread of a machine under ``flock``.

The disk cache's usage ledger and the emulated storage link's "busy until" clock are such
numbers.  Each thread of each process opens the file itself: ``flock`` excludes per open
file, so a descriptor shared by threads (or inherited over ``fork``) would not exclude them
from each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import threading
from collections.abc import Iterator


class SharedValue:
    """A ``struct`` value (format ``fmt``) in the file ``path``; ``default`` when new."""

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

    def __getstate__(self) -> dict:
        return {"path": self.path, "fmt": self.fmt, "default": self.default}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["fmt"], state["default"])
