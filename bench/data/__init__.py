"""Data sets and per-rank loaders by name.

``build_data(data_cfg, cache_cfg, rank, world_size, device, seed) -> DataBundle``
looks ``data_cfg.name`` up in :data:`DATASETS`.  ``validate(data_cfg, cache_cfg,
world_size)`` runs the configuration-time checks in the launcher, before any worker.
Loaders follow the contract in :mod:`bench.data.loaders`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from bench.data.types import DataBundle, per_rank
from bench.registry import ConfigError, Registry

__all__ = ["DATASETS", "DataBundle", "build_data", "per_rank", "validate"]

DATASETS: Registry = Registry("data set")
VALIDATORS: dict[str, Callable[[Any], None]] = {}


def _array_loader(cfg: Any) -> Callable[..., Any]:
    """The loader class for in-memory arrays: batched torch ops, or DALI (data.loader=dali)."""
    if cfg.loader == "dali":
        from functools import partial

        from bench.data.dali_arrays import DaliArrayLoader

        return partial(
            DaliArrayLoader,
            threads=cfg.dali_threads or max(1, cfg.num_workers),
            prefetch=cfg.prefetch,
            dali_device=cfg.dali_device,
        )
    from bench.data.loaders import TensorLoader

    return TensorLoader


@DATASETS.register("digits")
def _digits(
    cfg: Any, cache: Any, rank: int, world: int, device: torch.device, seed: int
) -> DataBundle:
    from bench.data.digits import load_digits_split

    TensorLoader = _array_loader(cfg)

    tx, ty, vx, vy = load_digits_split(cfg.image_size, cfg.test_fraction, cfg.split_seed)
    mean = tx.mean(dim=(0, 2, 3))
    std = tx.std(dim=(0, 2, 3))
    common = dict(rank=rank, world_size=world, device=device, mean=mean, std=std, seed=seed)
    train = TensorLoader(
        tx,
        ty,
        batch_size=per_rank(cfg.batch_size, world, "data.batch_size"),
        train=True,
        pad=cfg.pad,
        flip=cfg.flip,
        **common,
    )
    ev = TensorLoader(
        vx, vy, batch_size=max(1, cfg.eval_batch_size // world), train=False, **common
    )
    return DataBundle(train, ev, 10, train.num_samples * world)


@DATASETS.register("cifar10")
def _cifar10(
    cfg: Any, cache: Any, rank: int, world: int, device: torch.device, seed: int
) -> DataBundle:
    from bench.data.cifar10 import MEAN, STD, load_cifar10

    TensorLoader = _array_loader(cfg)

    tx, ty, vx, vy = load_cifar10(cfg.root)
    common = dict(rank=rank, world_size=world, device=device, mean=MEAN, std=STD, seed=seed)
    train = TensorLoader(
        tx,
        ty,
        batch_size=per_rank(cfg.batch_size, world, "data.batch_size"),
        train=True,
        pad=cfg.pad,
        flip=cfg.flip,
        **common,
    )
    ev = TensorLoader(
        vx, vy, batch_size=max(1, cfg.eval_batch_size // world), train=False, **common
    )
    return DataBundle(train, ev, 10, train.num_samples * world)


def _folder(
    cfg: Any, cache: Any, rank: int, world: int, device: torch.device, seed: int
) -> DataBundle:
    from bench.data.folder_input import build_folder, uses_cached_input

    if uses_cached_input(
        cfg, cache
    ):  # DALI, a cache level, progressive sizes, slow or remote storage
        return build_folder(cfg, cache, rank, world, device, seed)
    from bench.data.folder import image_folders
    from bench.data.loaders import DeviceLoader

    tr, va = image_folders(
        cfg.root, cfg.train_dir, cfg.val_dir, cfg.image_size, cfg.eval_image_size, cfg.flip
    )
    n_classes = len(tr.classes)
    if cfg.num_classes and cfg.num_classes != n_classes:
        raise ConfigError(
            f"data.num_classes={cfg.num_classes} but {cfg.root} has {n_classes} class folders"
        )
    common = dict(
        rank=rank, world_size=world, device=device, num_workers=cfg.num_workers, seed=seed
    )
    train = DeviceLoader(
        tr, batch_size=per_rank(cfg.batch_size, world, "data.batch_size"), train=True, **common
    )
    ev = DeviceLoader(va, batch_size=max(1, cfg.eval_batch_size // world), train=False, **common)
    return DataBundle(train, ev, n_classes, len(train) * cfg.batch_size)


DATASETS.register("imagefolder")(_folder)
DATASETS.register("imagenet")(_folder)


@DATASETS.register("synthetic")
def _synthetic(
    cfg: Any, cache: Any, rank: int, world: int, device: torch.device, seed: int
) -> DataBundle:
    from bench.data.synthetic import SyntheticLoader

    b = per_rank(cfg.batch_size, world, "data.batch_size")
    shape = (cfg.channels, cfg.image_size, cfg.image_size)
    common = dict(
        shape=shape, num_classes=cfg.num_classes, device=device, rank=rank, world_size=world
    )
    train = SyntheticLoader(samples=cfg.synthetic_size, batch_size=b, seed=seed, **common)
    ev = SyntheticLoader(
        samples=max(cfg.synthetic_size // 8, b * world), batch_size=b, seed=seed + 1, **common
    )
    return DataBundle(train, ev, cfg.num_classes, len(train) * b * world, cfg.channels)


def _check_cifar(cfg: Any) -> None:
    from bench.data.cifar10 import check_root

    check_root(cfg.root)


def _check_folder(cfg: Any) -> None:
    from bench.data.folder import check_split
    from bench.data.storage import is_url

    if is_url(cfg.root):  # remote (fsspec) roots are listed when the loaders are built
        return

    check_split(cfg.root, cfg.train_dir)
    check_split(cfg.root, cfg.val_dir)


VALIDATORS.update(cifar10=_check_cifar, imagefolder=_check_folder, imagenet=_check_folder)


def validate(cfg: Any, cache_cfg: Any, world_size: int) -> None:
    """Configuration-time checks: known name, positive sizes, divisibility, data on disk."""
    DATASETS.get(cfg.name)
    if cfg.batch_size <= 0 or cfg.eval_batch_size <= 0:
        raise ConfigError(
            "data.batch_size and data.eval_batch_size must be positive, got "
            f"{cfg.batch_size}, {cfg.eval_batch_size}"
        )
    per_rank(cfg.batch_size, world_size, "data.batch_size (global)")
    if cfg.image_size <= 0 or cfg.eval_image_size <= 0:
        raise ConfigError("data.image_size and data.eval_image_size must be positive")
    if cfg.loader not in ("torch", "dali"):
        raise ConfigError(f"data.loader={cfg.loader!r}; choose torch or dali")
    if cfg.name in VALIDATORS:
        VALIDATORS[cfg.name](cfg)
    from bench.data.folder_input import (
        validate_input,
    )  # cache group, DALI, throttle, progressive sizes

    validate_input(cfg, cache_cfg)


def build_data(
    cfg: Any, cache_cfg: Any, rank: int, world_size: int, device: torch.device, seed: int
) -> DataBundle:
    return DATASETS.get(cfg.name)(cfg, cache_cfg, rank, world_size, device, seed)
