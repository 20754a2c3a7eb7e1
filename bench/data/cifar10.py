"""CIFAR-10 from the standard python-pickle directory (``cifar-10-batches-py``)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from bench.registry import ConfigError

TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]
TEST_FILE = "test_batch"
MEAN = torch.tensor([0.4914, 0.4822, 0.4465]) * 255  # per channel, uint8 pixel units
STD = torch.tensor([0.2470, 0.2435, 0.2616]) * 255


def check_root(root: str) -> Path:
    p = Path(root).expanduser()
    if not root or not p.is_dir():
        raise ConfigError(
            f"data.root={root!r} is not a directory (expected the CIFAR-10 python-pickle folder)"
        )
    missing = [f for f in [*TRAIN_FILES, TEST_FILE] if not (p / f).is_file()]
    if missing:
        raise ConfigError(
            f"data.root={root!r} lacks the CIFAR-10 batch files: {', '.join(missing)}"
        )
    return p


def _read(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        d = pickle.load(f, encoding="bytes")
    data = d.get(b"data", d.get("data"))
    labels = d.get(b"labels", d.get("labels"))
    if data is None or labels is None:
        raise ConfigError(f"{path} is not a CIFAR-10 batch file (no data/labels)")
    return np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32), np.asarray(
        labels, dtype=np.int64
    )


def load_cifar10(root: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train_x uint8 NCHW, train_y, test_x, test_y)."""
    p = check_root(root)
    parts = [_read(p / f) for f in TRAIN_FILES]
    tx = np.concatenate([a for a, _ in parts])
    ty = np.concatenate([b for _, b in parts])
    vx, vy = _read(p / TEST_FILE)
    return torch.from_numpy(tx), torch.from_numpy(ty), torch.from_numpy(vx), torch.from_numpy(vy)
