"""Shared fixtures: small data sets made on the fly (nothing is downloaded)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The machine in the log's header: float results differ in the last bits between CPU
    kinds, so a failing CI log has to say which one it ran on."""
    import torch

    from bench.results.env import hardware

    return [
        f"hardware: {hardware()}",
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
    ]


def make_cifar_dir(root: Path, per_batch: int = 20, seed: int = 0) -> Path:
    """A CIFAR-10 python-pickle folder with ``per_batch`` images per batch file."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        d = {
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"labels": [int(v) for v in rng.integers(0, 10, per_batch)],
            b"batch_label": name.encode(),
        }
        with open(root / name, "wb") as f:
            pickle.dump(d, f)
    return root


def make_jpeg_folder(
    root: Path, classes: int = 3, per_class: int = 4, size: int = 40, seed: int = 0
) -> Path:
    """``root/{train,val}/c<i>/<j>.jpg`` with random-colour JPEGs."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for c in range(classes):
            d = root / split / f"c{c}"
            d.mkdir(parents=True, exist_ok=True)
            for j in range(per_class):
                arr = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(arr).save(d / f"{j}.jpg", quality=90)
    return root


@pytest.fixture
def cifar_dir(tmp_path: Path) -> Path:
    return make_cifar_dir(tmp_path / "cifar-10-batches-py")


@pytest.fixture
def jpeg_dir(tmp_path: Path) -> Path:
    return make_jpeg_folder(tmp_path / "imgs")


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """``python -m reproduce ...`` in a subprocess, as a user would type it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0")
    return subprocess.run(
        [sys.executable, "-m", "reproduce", *args],
        cwd=cwd or REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# a training run small enough for tests: tiny ResNet-9, one or two steps per epoch
TINY = [
    "model.width=4",
    "train.max_steps_per_epoch=2",
    "train.progress=false",
    "data.batch_size=32",
    "data.eval_batch_size=128",
    "results.plot=false",
]
