"""Room for a run's last record while its workers fill the disk: :data:`ROOM` bytes held in
a hidden file while they run, freed before an ``error`` record (docs/internals/launch.md)."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

ROOM = 64 * 1024  # bytes: an error record and the closing lines of its logs, many times
PREFIX = ".room-"


class Room:
    """Bytes held in ``path`` (None: nothing could be held, the disk was full already)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def release(self) -> None:  # idempotent
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
            self.path = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def hold(results_dir: str | Path, run_id: str, size: int = ROOM) -> Room:
    d = Path(results_dir)
    path = d / f"{PREFIX}{run_id}-{os.getpid()}"
    try:
        d.mkdir(parents=True, exist_ok=True)
        for p in d.glob(f"{PREFIX}*"):  # the rooms of launchers that died
            pid = p.name.rsplit("-", 1)[-1]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    p.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return Room(None)
    try:
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError:  # a file system without fallocate: real blocks of zeros
            os.ftruncate(fd, 0)
            os.write(fd, bytes(size))
        os.fsync(fd)
    except OSError:  # not even this fits: hold nothing, leave nothing
        os.close(fd)
        path.unlink(missing_ok=True)
        return Room(None)
    os.close(fd)
    return Room(path)


FULL_BELOW = 1 << 20  # bytes: less free than this, after a failed write, is a full disk


def nearly_full(path: str | Path) -> bool:
    """Whether ``path``'s file system is as good as full (torch.save's error lacks ENOSPC)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    # root may write into the blocks reserved for it; other users may not
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize < FULL_BELOW


def disk_of(path: str | Path) -> str:
    """``tmpfs at /mnt/x, 0 B of 256 KiB free``: the file system that holds ``path``."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    mount = p
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    kind = "file system"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()  # device, mount point (spaces as \040), type, ...
            if len(fields) > 2 and fields[1].replace("\\040", " ") == str(mount):
                kind = f"{fields[2]} {fields[0]}" if fields[0] != fields[2] else fields[2]
    try:
        st = os.statvfs(mount)
    except OSError:
        return f"{kind} at {mount}"
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    return f"{kind} at {mount}, {_bytes(free)} of {_bytes(st.f_blocks * st.f_frsize)} free"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.0f} GiB"


def no_space(e: BaseException, where: str | Path) -> str | None:
    """One line for a full disk or quota met writing under ``where``; None for other errors."""
    if not isinstance(e, OSError) or e.errno not in (errno.ENOSPC, errno.EDQUOT):
        return None
    path = e.filename or where
    return f"no space left on device writing {path} ({disk_of(path)})"
