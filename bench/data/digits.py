"""The embedded default data set: scikit-learn's bundled 8x8 handwritten digits.

1,797 grey images of 10 classes ship inside scikit-learn, so a fresh machine can run the
DAWNBench-style recipe with no download.  Images are upsampled to 32x32 (bilinear) and
repeated over 3 channels so that the CIFAR-sized networks apply unchanged; the split is
a fixed stratified one (``data.test_fraction``, ``data.split_seed``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
import os
from pathlib import Path

import torch

Split = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
N_IMAGES = 1797  # scikit-learn's load_digits


def heldout_size(test_fraction: float = 0.2) -> int:
    """How many images the split holds out (scikit-learn rounds a fractional test size up)."""
    return math.ceil(N_IMAGES * test_fraction)


def cache_dir() -> Path:
    """Where the prepared split is kept: ``$BENCH_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/topk-dawnbench`` (``~/.cache/topk-dawnbench``)."""
    env = os.environ.get("BENCH_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "topk-dawnbench"


@functools.lru_cache(maxsize=4)
def load_digits_split(size: int = 32, test_fraction: float = 0.2, split_seed: int = 0) -> Split:
    """(train_x, train_y, test_x, test_y); x float in [0, 1], shape (N, 3, size, size).

    Importing scikit-learn takes ~3 s of CPU per process on a small machine (every worker
    of every run), so the prepared split is saved once per scikit-learn version and
    arguments and read back from then on; a cache that cannot be read or written is
    only skipped."""
    version = importlib.metadata.version("scikit-learn")
    path = cache_dir() / f"digits-{version}-{size}-{test_fraction:g}-{split_seed}.pt"
    try:
        return tuple(torch.load(path, weights_only=True))  # type: ignore[return-value]
    except Exception:  # noqa: BLE001  (absent, partial or foreign: prepare it again)
        pass
    split = _prepare(size, test_fraction, split_seed)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        torch.save(list(split), tmp)
        tmp.replace(path)  # atomic: workers preparing at once never read a partial file
    except OSError:
        pass
    return split


def _prepare(size: int, test_fraction: float, split_seed: int) -> Split:
    # deferred: scikit-learn only for the digits data set
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8), pixel 0..16
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.clamp_(0, 1).expand(-1, 3, -1, -1).contiguous()
    y = torch.tensor(d.target, dtype=torch.long)
    idx = torch.arange(len(y)).numpy()
    tr, te = train_test_split(
        idx, test_size=test_fraction, stratify=d.target, random_state=split_seed
    )
    tr, te = torch.as_tensor(sorted(tr)), torch.as_tensor(sorted(te))
    return x[tr], y[tr], x[te], y[te]
