"""All-or-nothing writes: a line is appended whole or the file is as it was; a file is
written whole under its name or not at all."""

from __future__ import annotations

import errno
import os
from pathlib import Path


class NotAppended(OSError):
    """Nothing was appended (the file was truncated back to its previous length)."""


def append(fd: int, data: bytes, *, what: str) -> None:
    """Append ``data`` at ``fd`` (``O_APPEND``, under the caller's lock) and fsync, or raise
    :class:`NotAppended` (naming ``what``) with the file as it was."""
    size = os.fstat(fd).st_size
    done = 0
    try:
        while done < len(data):
            n = os.write(fd, data[done:])
            if n <= 0:  # nothing written and no error: no progress is possible
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            done += n
        os.fsync(fd)
    except OSError as e:
        try:
            os.ftruncate(fd, size)  # freeing the partial line also frees its blocks
            os.fsync(fd)
        except OSError as again:
            raise NotAppended(
                again.errno, f"{what}: a partial line could not be removed ({again.strerror})"
            ) from e
        raise NotAppended(
            e.errno, f"{what}: not appended, the file is unchanged ({e.strerror})"
        ) from e


def write(path: str | Path, text: str, *, replace: bool = True) -> None:
    """``text`` at ``path``, whole (``replace=False``: FileExistsError when it exists); a
    failed write leaves no temporary file and names ``path`` in its error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        (os.replace if replace else os.link)(tmp, path)
    except OSError as e:  # the file meant, not the temporary one (or none: a failed write)
        raise OSError(e.errno, e.strerror, str(path)) from None
    finally:
        tmp.unlink(missing_ok=True)
