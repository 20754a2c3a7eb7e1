"""Input assembly for image folders read through the cache, DALI or slow storage.

:func:`build_folder` builds the train and evaluation loaders of an ImageNet-style folder
(torch :class:`bench.data.cached_folder.CachedFolderLoader` or DALI
:class:`bench.data.dali.DaliFolderLoader`) over the storage level 0 and the cache levels;
:func:`uses_cached_input` says when a folder needs them instead of plain torchvision;
:func:`validate_input` checks the input-pipeline settings at configuration time.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from bench.data.cache import CACHES, build_reader, validate_cache
from bench.data.cached_folder import CachedFolderLoader, FolderDataset
from bench.data.config import CacheConfig, DataConfig, train_size_at, train_sizes
from bench.data.dali import DaliFolderLoader
from bench.data.dali_common import require_dali
from bench.data.storage import LocalStorage, is_url, list_folder, open_storage
from bench.data.types import DataBundle, per_rank
from bench.registry import ConfigError

if TYPE_CHECKING:
    import torch

    from bench.data.storage import Storage


def uses_cached_input(data_cfg: DataConfig, cache_cfg: CacheConfig) -> bool:
    """Whether a folder data set needs this module's loaders instead of plain torchvision."""

    return (
        data_cfg.loader == "dali"
        or cache_cfg.name != "none"
        or bool(data_cfg.progressive)
        or data_cfg.throttle_mbps > 0
        or data_cfg.throttle_ms > 0
        or is_url(data_cfg.root)
    )


def build_folder(
    data_cfg: DataConfig,
    cache_cfg: CacheConfig,
    rank: int,
    world_size: int,
    device: torch.device,
    seed: int,
) -> DataBundle:
    """The DataBundle of an ImageNet-style folder read through the cache (torch or DALI)."""

    store = open_storage(data_cfg.root, data_cfg.throttle_mbps, data_cfg.throttle_ms)
    tr = list_folder(store, data_cfg.train_dir)
    va = list_folder(store, data_cfg.val_dir, tr.classes)
    n_classes = len(tr.classes)
    if data_cfg.num_classes and data_cfg.num_classes != n_classes:
        raise ConfigError(
            f"data.num_classes={data_cfg.num_classes} but {data_cfg.root} "
            f"has {n_classes} class folders"
        )
    make = _dali_loaders if data_cfg.loader == "dali" else _torch_loaders
    train, ev = make(data_cfg, cache_cfg, store, (tr, va), rank, world_size, device, seed)
    return DataBundle(train, ev, n_classes, len(train) * data_cfg.batch_size)


def _sizes(data_cfg: DataConfig) -> tuple[Callable[[int], int], Callable[[int], int]]:
    """(training size, evaluation size) in pixels as functions of the epoch."""

    return partial(train_size_at, data_cfg), lambda epoch: data_cfg.eval_image_size


def _batches(data_cfg: DataConfig, world_size: int) -> tuple[int, int]:
    """(training, evaluation) batch per rank."""
    b = per_rank(data_cfg.batch_size, world_size, "data.batch_size")
    return b, max(1, data_cfg.eval_batch_size // world_size)


def _predecoded(data_cfg: DataConfig, cache_cfg: CacheConfig) -> int:
    """Non-zero when the cache level holds decoded pixels, which the loaders then read.

    The size itself is the reader's: ``cache.predecode_size`` caps the shorter side, 0 keeps
    the original resolution (never upsampled, so random-resized crops are those the
    original images give).  The value passed here (the largest training or evaluation
    size) only marks the level as decoded.
    """

    if not CACHES.get(cache_cfg.name).decoded:
        return 0
    return max(train_sizes(data_cfg) + [data_cfg.eval_image_size])


def _dali_loaders(
    data_cfg: DataConfig,
    cache_cfg: CacheConfig,
    store: Storage,
    listings: tuple,
    rank: int,
    world_size: int,
    device: torch.device,
    seed: int,
) -> tuple[Any, Any]:

    plain = isinstance(store, LocalStorage) and cache_cfg.name == "none"

    def reader():  # one per loader: evaluation reads never count in the training epoch
        return None if plain else build_reader(store, cache_cfg, store.root)

    common = dict(
        mode="reader" if plain else "external",
        local_root=store.root,
        rank=rank,
        world_size=world_size,
        device=device,
        threads=data_cfg.dali_threads or max(1, data_cfg.num_workers),
        prefetch=data_cfg.prefetch,
        seed=seed,
        flip=data_cfg.flip,
        strict=data_cfg.strict,
        dali_device=data_cfg.dali_device,
        predecode_size=_predecoded(data_cfg, cache_cfg),
    )
    (tr, va), (b, eb), (ts, es) = listings, _batches(data_cfg, world_size), _sizes(data_cfg)
    train = DaliFolderLoader(tr, train=True, batch_size=b, size_at=ts, reader=reader(), **common)
    ev = DaliFolderLoader(va, train=False, batch_size=eb, size_at=es, reader=reader(), **common)
    return train, ev


def _torch_loaders(
    data_cfg: DataConfig,
    cache_cfg: CacheConfig,
    store: Storage,
    listings: tuple,
    rank: int,
    world_size: int,
    device: torch.device,
    seed: int,
) -> tuple[Any, Any]:

    workers = data_cfg.num_workers
    common = dict(
        rank=rank,
        world_size=world_size,
        device=device,
        num_workers=workers,
        seed=seed,
        strict=data_cfg.strict,
        prefetch=data_cfg.prefetch,
    )
    pre, share = _predecoded(data_cfg, cache_cfg), max(1, workers)
    (tr, va), (b, eb), (ts, es) = listings, _batches(data_cfg, world_size), _sizes(data_cfg)
    flip = data_cfg.flip
    train_ds = FolderDataset(store, tr, cache_cfg, store.root, True, flip, pre, share)
    eval_ds = FolderDataset(store, va, cache_cfg, store.root, False, False, pre, share)
    train = CachedFolderLoader(train_ds, batch_size=b, size_at=ts, **common)
    ev = CachedFolderLoader(eval_ds, batch_size=eb, size_at=es, **common)
    return train, ev


def validate_input(data_cfg: DataConfig, cache_cfg: CacheConfig) -> None:
    """Configuration-time checks of the input-pipeline settings (ConfigError on bad ones)."""

    validate_cache(cache_cfg)
    if data_cfg.loader == "dali":
        require_dali()
    if data_cfg.dali_threads < 0 or data_cfg.prefetch < 1:
        raise ConfigError("data.dali_threads must be >= 0 and data.prefetch >= 1")
    if data_cfg.throttle_mbps < 0 or data_cfg.throttle_ms < 0:
        raise ConfigError("data.throttle_mbps and data.throttle_ms must be >= 0 (0 = off)")
    for pair in data_cfg.progressive:
        if len(pair) != 2 or int(pair[0]) < 0 or int(pair[1]) <= 0:
            raise ConfigError(
                f"data.progressive entries are [epoch >= 0, size > 0] pairs, got {list(pair)}"
            )
