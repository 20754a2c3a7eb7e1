"""Damaged image folders for the loader tests."""

from __future__ import annotations

import os


def corrupt_files(root: str, split: str = "train") -> list[str]:
    """Damage a folder for tests: truncate one JPEG and replace another with junk.

    Returns the two relative paths (``split/class/file``) that were damaged.
    """
    d = os.path.join(root, split)
    cls = sorted(os.listdir(d))[0]
    names = sorted(os.listdir(os.path.join(d, cls)))
    a, b = os.path.join(d, cls, names[0]), os.path.join(d, cls, names[1])
    with open(a, "rb") as f:
        data = f.read()
    with open(a, "wb") as f:
        f.write(data[: len(data) // 2])  # truncated: no end-of-image marker
    with open(b, "wb") as f:
        f.write(b"this is not a JPEG file" * 10)
    return [f"{split}/{cls}/{names[0]}", f"{split}/{cls}/{names[1]}"]
