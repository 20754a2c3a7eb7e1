"""Input assembly for image folders read through the cache, DALI or slow storage.

:func:`build_folder` builds the train and evaluation loaders of an ImageNet-style folder
(torch :class:`bench.data.cached_folder.CachedFolderLoader` or DALI
:class:`bench.data.dali.DaliFolderLoader`) over the storage level 0 and the cache levels;
:func:`uses_cached_input` says when a folder needs them instead of plain torchvision;
:func:`validate_input` checks the input-pipeline settings at configuration time.
"""

from __future__ import annotations

from typing import Any

from bench.data.types import DataBundle, per_rank
from bench.registry import ConfigError


def predecode_size(data_cfg: Any, cache_cfg: Any) -> int:
    """Shorter side (pixels) for pre-decoded images: 8/7 x the largest size the run uses.

    8/7 = 1 / 0.875 is the evaluation resize ratio; random-resized crops of the training
    sizes then rarely need to upsample.
    """
    from bench.data.config import train_sizes

    if cache_cfg.predecode_size:
        return int(cache_cfg.predecode_size)
    return round(max(train_sizes(data_cfg) + [data_cfg.eval_image_size]) / 0.875)


def uses_cached_input(data_cfg: Any, cache_cfg: Any) -> bool:
    """Whether a folder data set needs this module's loaders instead of plain torchvision."""
    from bench.data.storage import is_url

    return (
        data_cfg.loader == "dali"
        or cache_cfg.name != "none"
        or bool(data_cfg.progressive)
        or data_cfg.throttle_mbps > 0
        or data_cfg.throttle_ms > 0
        or is_url(data_cfg.root)
    )


def build_folder(data_cfg: Any, cache_cfg: Any, rank: int, world_size: int, device: Any, seed: int):
    """The DataBundle of an ImageNet-style folder read through the cache (torch or DALI)."""
    from functools import partial

    from bench.data.cache import CACHES, build_reader
    from bench.data.cached_folder import CachedFolderLoader, FolderDataset
    from bench.data.config import train_size_at
    from bench.data.dali import DaliFolderLoader
    from bench.data.storage import LocalStorage, list_folder, open_storage

    store = open_storage(data_cfg.root, data_cfg.throttle_mbps, data_cfg.throttle_ms)
    tr = list_folder(store, data_cfg.train_dir)
    va = list_folder(store, data_cfg.val_dir, tr.classes)
    n_classes = len(tr.classes)
    if data_cfg.num_classes and data_cfg.num_classes != n_classes:
        raise ConfigError(
            f"data.num_classes={data_cfg.num_classes} but {data_cfg.root} "
            f"has {n_classes} class folders"
        )
    b = per_rank(data_cfg.batch_size, world_size, "data.batch_size")
    eb = max(1, data_cfg.eval_batch_size // world_size)
    levels = CACHES.get(cache_cfg.name)
    pre = predecode_size(data_cfg, cache_cfg) if levels.decoded else 0
    train_size = partial(train_size_at, data_cfg)

    def eval_size(epoch: int) -> int:
        return data_cfg.eval_image_size

    if data_cfg.loader == "dali":
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
            predecode_size=pre,
        )
        train = DaliFolderLoader(
            tr, train=True, batch_size=b, size_at=train_size, reader=reader(), **common
        )
        ev = DaliFolderLoader(
            va, train=False, batch_size=eb, size_at=eval_size, reader=reader(), **common
        )
    else:
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
        share = max(1, workers)
        train = CachedFolderLoader(
            FolderDataset(store, tr, cache_cfg, store.root, True, data_cfg.flip, pre, share),
            batch_size=b,
            size_at=train_size,
            **common,
        )
        ev = CachedFolderLoader(
            FolderDataset(store, va, cache_cfg, store.root, False, False, pre, share),
            batch_size=eb,
            size_at=eval_size,
            **common,
        )
    return DataBundle(train, ev, n_classes, len(train) * data_cfg.batch_size)


def validate_input(data_cfg: Any, cache_cfg: Any) -> None:
    """Configuration-time checks of the input-pipeline settings (ConfigError on bad ones)."""
    from bench.data.cache import validate_cache

    validate_cache(cache_cfg)
    if data_cfg.loader == "dali":
        from bench.data.dali_common import require_dali

        require_dali()
    if data_cfg.dali_device not in ("auto", "cpu", "gpu"):
        raise ConfigError(f"data.dali_device={data_cfg.dali_device!r}; choose auto, cpu or gpu")
    if data_cfg.dali_threads < 0 or data_cfg.prefetch < 1:
        raise ConfigError("data.dali_threads must be >= 0 and data.prefetch >= 1")
    if data_cfg.throttle_mbps < 0 or data_cfg.throttle_ms < 0:
        raise ConfigError("data.throttle_mbps and data.throttle_ms must be >= 0 (0 = off)")
    for pair in data_cfg.progressive:
        if len(pair) != 2 or int(pair[0]) < 0 or int(pair[1]) <= 0:
            raise ConfigError(
                f"data.progressive entries are [epoch >= 0, size > 0] pairs, got {list(pair)}"
            )
