"""Data sets by name: the DATASETS registry of :class:`DatasetSpec` (adding a data set touches
this file only), and the in-memory ones: scikit-learn's 8x8 digits (upsampled, 3 channels, a
fixed stratified split; no download) and CIFAR-10 from its python-pickle folder."""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import math
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.data.config import CacheConfig, DataConfig
from bench.data.loaders import (
    DataBundle,
    SyntheticLoader,
    TensorLoader,
    per_rank,
)
from bench.registry import ConfigError, Registry

Builder = Callable[[DataConfig, CacheConfig, int, int, torch.device, int], DataBundle]


@dataclass(frozen=True)
class DatasetSpec:
    """One data set: how to build its loaders, and what to check before any worker starts."""

    build: Builder  # (data_cfg, cache_cfg, rank, world_size, device, seed) -> DataBundle
    check: Callable[[DataConfig], None] | None = None  # e.g. the files are on disk
    dali: bool = False  # data.loader=dali reads it (image folders)


# A data set's own modules are imported when its builder or check runs: the config schema
# imports bench.data.config, which runs this __init__, so importing them here would load
# DALI and torchvision for every run and make their imports of this package circular.
DATASETS: Registry[DatasetSpec] = Registry("data set")


# --- the embedded digits ---

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
    """(train_x, train_y, test_x, test_y); x float in [0, 1], shape (N, 3, size, size), prepared
    once per scikit-learn version and arguments and read back from the cache directory."""
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


# --- CIFAR-10 ---

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
    x = np.asarray(data, dtype=np.uint8).reshape(-1, 3, 32, 32)
    return x, np.asarray(labels, dtype=np.int64)


def load_cifar10(root: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train_x uint8 NCHW, train_y, test_x, test_y)."""
    p = check_root(root)
    tx, ty = (np.concatenate(a) for a in zip(*(_read(p / f) for f in TRAIN_FILES)))
    vx, vy = _read(p / TEST_FILE)
    return torch.from_numpy(tx), torch.from_numpy(ty), torch.from_numpy(vx), torch.from_numpy(vy)


def _arrays(cfg: DataConfig, rank, world, device, seed, arrays: tuple, stats) -> DataBundle:
    """``arrays``: (train x, y, eval x, y); ``stats``: (mean, std) per channel, units of x."""
    tx, ty, vx, vy = arrays
    common = dict(rank=rank, world_size=world, device=device, mean=stats[0], std=stats[1])
    b = per_rank(cfg.batch_size, world, "data.batch_size")
    common["seed"] = seed
    train = TensorLoader(tx, ty, batch_size=b, train=True, pad=cfg.pad, flip=cfg.flip, **common)
    eb = max(1, cfg.eval_batch_size // world)
    ev = TensorLoader(vx, vy, batch_size=eb, train=False, **common)
    return DataBundle(train, ev, 10, len(ty) // world * world)


def _digits(cfg: DataConfig, cache, rank, world, device, seed) -> DataBundle:
    arrays = load_digits_split(cfg.image_size, cfg.test_fraction, cfg.split_seed)
    tx = arrays[0]
    return _arrays(cfg, rank, world, device, seed, arrays, (tx.mean((0, 2, 3)), tx.std((0, 2, 3))))


def _cifar10(cfg: DataConfig, cache, rank, world, device, seed) -> DataBundle:
    return _arrays(cfg, rank, world, device, seed, load_cifar10(cfg.root), (MEAN, STD))


def _synthetic(cfg: DataConfig, cache, rank, world, device, seed) -> DataBundle:
    b = per_rank(cfg.batch_size, world, "data.batch_size")
    shape = (cfg.channels, cfg.image_size, cfg.image_size)
    common = dict(shape=shape, num_classes=cfg.num_classes, device=device, rank=rank)
    common.update(world_size=world, batch_size=b)
    train = SyntheticLoader(samples=cfg.synthetic_size, seed=seed, **common)
    ev = SyntheticLoader(samples=max(cfg.synthetic_size // 8, b * world), seed=seed + 1, **common)
    return DataBundle(train, ev, cfg.num_classes, len(train) * b * world, cfg.channels)


def _deferred(module: str, name: str) -> Callable[..., Any]:
    """``module.name``, imported when first called (see the note above DATASETS)."""
    return lambda *args: getattr(importlib.import_module(module), name)(*args)


def _check_cifar(cfg: DataConfig) -> None:
    check_root(cfg.root)
    _check_batch(cfg, 50_000, "CIFAR-10's training split")


def memory_bytes(cfg: DataConfig, size: int) -> int:
    """Bytes one worker holds of a data set kept whole in memory, at ``size`` pixels (the
    digits: both splits upsampled, float32); 0 for the data sets read from disk."""
    return 2 * N_IMAGES * 3 * size * size * 4 if cfg.name == "digits" else 0


def _check_digits(cfg: DataConfig) -> None:
    if not 0 < cfg.test_fraction < 1:
        raise ConfigError(f"data.test_fraction is a fraction in (0, 1), got {cfg.test_fraction}")
    n = N_IMAGES - heldout_size(cfg.test_fraction)
    _check_batch(cfg, n, "the digits training split")


def _check_batch(cfg: DataConfig, n: int, what: str) -> None:
    """A global batch larger than the training set gives epochs of no step: refused here."""
    if cfg.batch_size > n:
        raise ConfigError(f"data.batch_size={cfg.batch_size} is larger than {what} ({n} samples)")


DATASETS.register("digits")(DatasetSpec(_digits, _check_digits))
DATASETS.register("cifar10")(DatasetSpec(_cifar10, _check_cifar))
_FOLDER = DatasetSpec(
    _deferred("bench.data.cached_folder", "build_folder"),
    _deferred("bench.data.folder", "check"),
    dali=True,
)
DATASETS.register("imagefolder")(_FOLDER)
DATASETS.register("imagenet")(_FOLDER)
DATASETS.register("synthetic")(DatasetSpec(_synthetic))
_TRANSLATION = "bench.data.translation"
DATASETS.register("translation")(
    DatasetSpec(_deferred(_TRANSLATION, "build"), _deferred(_TRANSLATION, "check"))
)


def validate(cfg: DataConfig, cache_cfg: CacheConfig, world_size: int) -> None:
    """Configuration-time checks: known name, positive sizes, divisibility, data on disk."""
    spec = DATASETS.get(cfg.name)
    if cfg.batch_size <= 0 or cfg.eval_batch_size <= 0:
        raise ConfigError(
            "data.batch_size and data.eval_batch_size must be positive, got "
            f"{cfg.batch_size}, {cfg.eval_batch_size}"
        )
    per_rank(cfg.batch_size, world_size, "data.batch_size (global)")
    if cfg.image_size <= 0 or cfg.eval_image_size <= 0:
        raise ConfigError("data.image_size and data.eval_image_size must be positive")
    if spec.check is not None:
        spec.check(cfg)
    # deferred: see the note above DATASETS
    from bench.data.cache import validate_cache
    from bench.data.dali import require_dali

    validate_cache(cache_cfg)  # the input pipeline: cache, DALI, throttle, progressive sizes
    if cfg.loader == "dali" and not spec.dali:
        raise ConfigError(
            f"data.loader=dali reads image folders; data={cfg.name} is batched on the training "
            "device by torch: use data.loader=torch"
        )
    if cfg.loader == "dali":
        require_dali()
    if cfg.dali_threads < 0 or cfg.prefetch < 1:
        raise ConfigError("data.dali_threads must be >= 0 and data.prefetch >= 1")
    if cfg.throttle_mbps < 0 or cfg.throttle_ms < 0:
        raise ConfigError("data.throttle_mbps and data.throttle_ms must be >= 0 (0 = off)")
    for pair in cfg.progressive:
        if len(pair) != 2 or int(pair[0]) < 0 or int(pair[1]) <= 0:
            raise ConfigError(
                f"data.progressive entries are [epoch >= 0, size > 0] pairs, got {list(pair)}"
            )


def build_data(
    cfg: DataConfig, cache_cfg: CacheConfig, rank: int, world: int, device: torch.device, seed: int
) -> DataBundle:
    """The train and evaluation loaders of this rank (see :class:`DataBundle`)."""
    return DATASETS.get(cfg.name).build(cfg, cache_cfg, rank, world, device, seed)
