"""Data sets and per-rank loaders by name.

``build_data(data_cfg, cache_cfg, rank, world_size, device, seed) -> DataBundle``
looks ``data_cfg.name`` up in :data:`DATASETS`, whose entries are :class:`DatasetSpec`
objects carrying the builder and the configuration-time check of one data set (adding a
data set touches this file only).  ``validate(data_cfg, cache_cfg, world_size)`` runs the
configuration-time checks in the launcher, before any worker.  Loaders follow the
contract in :mod:`bench.data.loaders`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from bench.data.config import CacheConfig, DataConfig
from bench.data.types import DataBundle, per_rank
from bench.registry import ConfigError, Registry

__all__ = ["DATASETS", "DataBundle", "DatasetSpec", "build_data", "per_rank", "validate"]

Builder = Callable[[DataConfig, CacheConfig, int, int, torch.device, int], DataBundle]


@dataclass(frozen=True)
class DatasetSpec:
    """One data set: how to build its loaders, and what to check before any worker starts."""

    build: Builder  # (data_cfg, cache_cfg, rank, world_size, device, seed) -> DataBundle
    check: Callable[[DataConfig], None] | None = None  # e.g. the files are on disk


# Each data set's modules are imported by its builder or check, when it runs: this
# package's __init__ runs on the first import of any of its modules (the config schema
# imports bench.data.config), so importing every loader here would load them all for
# every run, DALI and torchvision paths included, and would make their own imports of
# this package's modules circular.
DATASETS: Registry[DatasetSpec] = Registry("data set")


def _array_loader(cfg: DataConfig) -> Callable[..., Any]:
    """The loader class for in-memory arrays: batched torch ops, or DALI (data.loader=dali)."""
    if cfg.loader == "dali":
        # deferred: see the note above DATASETS
        from bench.data.dali_arrays import DaliArrayLoader

        return partial(
            DaliArrayLoader,
            threads=cfg.dali_threads or max(1, cfg.num_workers),
            prefetch=cfg.prefetch,
            dali_device=cfg.dali_device,
        )
    from bench.data.loaders import TensorLoader

    return TensorLoader


def _arrays(
    cfg: DataConfig, rank: int, world: int, device: torch.device, seed: int, arrays: tuple, stats
) -> DataBundle:
    """The bundle of an in-memory data set: ``arrays`` = (train x, y, eval x, y), ``stats``
    = (mean, std) per channel in the units of x."""
    loader = _array_loader(cfg)
    tx, ty, vx, vy = arrays
    mean, std = stats
    common = dict(rank=rank, world_size=world, device=device, mean=mean, std=std, seed=seed)
    b = per_rank(cfg.batch_size, world, "data.batch_size")
    train = loader(tx, ty, batch_size=b, train=True, pad=cfg.pad, flip=cfg.flip, **common)
    ev = loader(vx, vy, batch_size=max(1, cfg.eval_batch_size // world), train=False, **common)
    return DataBundle(train, ev, 10, train.num_samples * world)


def _digits(
    cfg: DataConfig, cache: CacheConfig, rank: int, world: int, device: torch.device, seed: int
) -> DataBundle:
    # deferred: see the note above DATASETS
    from bench.data.digits import load_digits_split

    arrays = load_digits_split(cfg.image_size, cfg.test_fraction, cfg.split_seed)
    tx = arrays[0]
    return _arrays(cfg, rank, world, device, seed, arrays, (tx.mean((0, 2, 3)), tx.std((0, 2, 3))))


def _cifar10(
    cfg: DataConfig, cache: CacheConfig, rank: int, world: int, device: torch.device, seed: int
) -> DataBundle:
    # deferred: see the note above DATASETS
    from bench.data.cifar10 import MEAN, STD, load_cifar10

    return _arrays(cfg, rank, world, device, seed, load_cifar10(cfg.root), (MEAN, STD))


def _folder(
    cfg: DataConfig, cache: CacheConfig, rank: int, world: int, device: torch.device, seed: int
) -> DataBundle:
    # deferred: see the note above DATASETS
    from bench.data.folder_input import build_folder, uses_cached_input

    if uses_cached_input(cfg, cache):  # DALI, a cache level, progressive sizes, slow/remote
        return build_folder(cfg, cache, rank, world, device, seed)
    from bench.data.damaged import SkipDamaged, SkippingLoader, load_rgb
    from bench.data.folder import image_folders

    tr, va = image_folders(
        cfg.root, cfg.train_dir, cfg.val_dir, cfg.image_size, cfg.eval_image_size, cfg.flip,
        loader=load_rgb,  # damaged files: skipped and counted, or one error (data.strict)
    )  # fmt: skip
    n_classes = len(tr.classes)
    if cfg.num_classes and cfg.num_classes != n_classes:
        raise ConfigError(
            f"data.num_classes={cfg.num_classes} but {cfg.root} has {n_classes} class folders"
        )
    common = dict(
        rank=rank, world_size=world, device=device, num_workers=cfg.num_workers, seed=seed
    )
    b = per_rank(cfg.batch_size, world, "data.batch_size")
    common["strict"] = cfg.strict
    train = SkippingLoader(SkipDamaged(tr, substitute=True), batch_size=b, train=True, **common)
    eb = max(1, cfg.eval_batch_size // world)
    ev = SkippingLoader(SkipDamaged(va, substitute=False), batch_size=eb, train=False, **common)
    return DataBundle(train, ev, n_classes, len(train) * cfg.batch_size)


def _synthetic(
    cfg: DataConfig, cache: CacheConfig, rank: int, world: int, device: torch.device, seed: int
) -> DataBundle:
    # deferred: see the note above DATASETS
    from bench.data.synthetic import SyntheticLoader

    b = per_rank(cfg.batch_size, world, "data.batch_size")
    shape = (cfg.channels, cfg.image_size, cfg.image_size)
    common = dict(
        shape=shape, num_classes=cfg.num_classes, device=device, rank=rank, world_size=world
    )
    train = SyntheticLoader(samples=cfg.synthetic_size, batch_size=b, seed=seed, **common)
    ev_samples = max(cfg.synthetic_size // 8, b * world)
    ev = SyntheticLoader(samples=ev_samples, batch_size=b, seed=seed + 1, **common)
    return DataBundle(train, ev, cfg.num_classes, len(train) * b * world, cfg.channels)


def _translation(
    cfg: DataConfig, cache: CacheConfig, rank: int, world: int, device: torch.device, seed: int
) -> DataBundle:
    # deferred: see the note above DATASETS
    from bench.data.translation import build

    return build(cfg, cache, rank, world, device, seed)


def _check_translation(cfg: DataConfig) -> None:
    # deferred: see the note above DATASETS
    from bench.data.translation import check

    check(cfg)


def _check_cifar(cfg: DataConfig) -> None:
    # deferred: see the note above DATASETS
    from bench.data.cifar10 import check_root

    check_root(cfg.root)
    _check_batch(cfg, 50_000, "CIFAR-10's training split")


DIGITS_SAMPLES = 1797  # scikit-learn's digits, a fixed data set


def _check_digits(cfg: DataConfig) -> None:
    import math

    if not 0 < cfg.test_fraction < 1:
        raise ConfigError(f"data.test_fraction is a fraction in (0, 1), got {cfg.test_fraction}")
    # train_test_split holds out ceil(fraction x samples)
    n = DIGITS_SAMPLES - math.ceil(cfg.test_fraction * DIGITS_SAMPLES)
    _check_batch(cfg, n, "the digits training split")


def _check_batch(cfg: DataConfig, n: int, what: str) -> None:
    """A global batch larger than the training set gives epochs of no full batch (no
    steps): refused here rather than found by the workers."""
    if cfg.batch_size > n:
        raise ConfigError(f"data.batch_size={cfg.batch_size} is larger than {what} ({n} samples)")


def _check_folder(cfg: DataConfig) -> None:
    # deferred: see the note above DATASETS
    from bench.data.folder import check_pair, check_split
    from bench.data.storage import is_url

    if is_url(cfg.root):  # remote (fsspec) roots are listed when the loaders are built
        return
    train, val = check_split(cfg.root, cfg.train_dir), check_split(cfg.root, cfg.val_dir)
    check_pair(train, val, cfg.batch_size)


DATASETS.register("digits")(DatasetSpec(_digits, _check_digits))
DATASETS.register("cifar10")(DatasetSpec(_cifar10, _check_cifar))
DATASETS.register("imagefolder")(DatasetSpec(_folder, _check_folder))
DATASETS.register("imagenet")(DatasetSpec(_folder, _check_folder))
DATASETS.register("synthetic")(DatasetSpec(_synthetic))
DATASETS.register("translation")(DatasetSpec(_translation, _check_translation))


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
    from bench.data.folder_input import validate_input  # cache, DALI, throttle, progressive

    validate_input(cfg, cache_cfg)


def build_data(
    cfg: DataConfig,
    cache_cfg: CacheConfig,
    rank: int,
    world_size: int,
    device: torch.device,
    seed: int,
) -> DataBundle:
    """The train and evaluation loaders of this rank (see :class:`DataBundle`)."""
    return DATASETS.get(cfg.name).build(cfg, cache_cfg, rank, world_size, device, seed)
