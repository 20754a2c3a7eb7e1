"""Every loader, iterated as the training loop does, covers the data set under one rule.

The loop takes ``steps = len(loader)`` (or a smaller ``train.max_steps_per_epoch``) batches
per epoch from a fresh iterator, drops the iterator and calls ``set_epoch`` before the
next epoch.  Two ranks are simulated in one process.  Each sample's label is its index
(tensor loaders: ``labels = arange(n)``; folders: one class folder per image), so the
labels name the samples.  Sizes do not divide world x batch.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bench.data.loaders import rank_batches

CPU = torch.device("cpu")
WORLD, BATCH, SEED = 2, 3, 5
EVAL_BATCH = 4  # 17 = 8 + 9 samples: DALI's padded shard straddles a batch boundary
N_TRAIN, N_VAL = 23, 17


def _cache_cfg(name: str, tmp: Path) -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        dir=str(tmp / "cache"),
        disk_gb=1.0,
        memory_gb=1.0,
        predecode_size=0,
        verify="crc32",
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    from bench.data.jpegs import make_jpeg_folder

    root = tmp_path_factory.mktemp("one_class_per_image")
    make_jpeg_folder(str(root), N_TRAIN, N_TRAIN, "train", small=True)
    make_jpeg_folder(str(root), N_VAL, N_VAL, "val", small=True, seed=1)
    return root


def _arrays(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 3, 8, 8).contiguous()
    return x, torch.arange(n)


def _tensor(train: bool, rank: int, batch: int):
    x, y = _arrays(N_TRAIN if train else N_VAL)
    kw = dict(
        batch_size=batch,
        rank=rank,
        world_size=WORLD,
        device=CPU,
        mean=torch.zeros(3),
        std=torch.ones(3),
        train=train,
        seed=SEED,
    )
    from bench.data.loaders import TensorLoader

    return TensorLoader(x, y, **kw)


def _folder_loader(kind: str, train: bool, rank: int, tmp: Path, root: Path, batch: int):
    from bench.data.cache import build_reader
    from bench.data.cached_folder import CachedFolderLoader, FolderDataset
    from bench.data.storage import LocalStorage, list_folder

    store = LocalStorage(str(root))
    split = "train" if train else "val"
    with warnings.catch_warnings():  # val has fewer images, so some class folders are empty
        warnings.simplefilter("ignore")
        listing = list_folder(store, split, list_folder(store, "train").classes)
    loader, cache = kind.split(":")
    cfg = _cache_cfg(cache, tmp)
    common = dict(batch_size=batch, rank=rank, world_size=WORLD, device=CPU, seed=SEED)
    if loader == "cached":
        ds = FolderDataset(store, listing, cfg, str(root), train, True, 0, 1)
        return CachedFolderLoader(ds, num_workers=0, size_at=lambda e: 16, strict=False, **common)
    from bench.data.dali import DaliFolderLoader

    return DaliFolderLoader(
        listing,
        reader=build_reader(store, cfg, "t"),
        train=train,
        threads=1,
        prefetch=2,
        size_at=lambda e: 16,
        flip=True,
        strict=False,
        **common,
    )


KINDS = [
    "tensor",
    "cached:memory",
    "dali_external:none",
    "dali_external:multilevel",
]


def _make(kind: str, train: bool, tmp: Path, root: Path) -> list:
    if kind.startswith("dali"):
        pytest.importorskip("nvidia.dali")
    batch = BATCH if train else EVAL_BATCH
    if kind == "tensor":
        return [_tensor(train, r, batch) for r in range(WORLD)]
    return [_folder_loader(kind, train, r, tmp, root, batch) for r in range(WORLD)]


def _epoch(loaders: list, epoch: int, max_steps: int = 0) -> list[list[int]]:
    """One epoch as the training loop runs it; the sample ids each rank saw."""
    steps = len(loaders[0])
    steps = min(steps, max_steps) if max_steps else steps
    out = []
    for ld in loaders:
        ld.set_epoch(epoch)
        it = iter(ld)
        out.append([int(v) for _ in range(steps) for v in next(it)[1]])
        del it
    return out


def _planned(n: int, epoch: int, steps: int) -> list[list[int]]:
    return [
        [int(i) for b in rank_batches(n, r, WORLD, BATCH, True, SEED, epoch)[:steps] for i in b]
        for r in range(WORLD)
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_training_epochs_follow_the_rule_and_cover_the_data(
    kind: str, tmp_path: Path, folder: Path
) -> None:
    loaders = _make(kind, True, tmp_path, folder)
    steps = len(loaders[0])
    assert steps == (N_TRAIN // WORLD) // BATCH and len(loaders[1]) == steps
    union: set[int] = set()
    for epoch in range(5):
        per_rank = _epoch(loaders, epoch)
        flat = [i for ids in per_rank for i in ids]
        assert len(flat) == len(set(flat)) == steps * BATCH * WORLD  # no duplicate, no miss
        assert [sorted(ids) for ids in per_rank] == [
            sorted(ids) for ids in _planned(N_TRAIN, epoch, steps)
        ]
        stats = loaders[0].epoch_stats()
        assert stats["data/rank_samples"] == len(per_rank[0])  # real samples, for throughput
        union |= set(flat)
    assert union == set(range(N_TRAIN))  # the n % world leftovers change every epoch


@pytest.mark.parametrize("kind", KINDS)
def test_short_epochs_start_clean(kind: str, tmp_path: Path, folder: Path) -> None:
    """train.max_steps_per_epoch: the iterator is dropped mid-epoch; the next epoch is its own."""
    loaders = _make(kind, True, tmp_path, folder)
    for epoch in range(3):
        per_rank = _epoch(loaders, epoch, max_steps=1)
        assert [sorted(ids) for ids in per_rank] == [
            sorted(ids) for ids in _planned(N_TRAIN, epoch, 1)
        ]
    assert sorted(i for ids in _epoch(loaders, 3) for i in ids) == sorted(
        i for ids in _planned(N_TRAIN, 3, len(loaders[0])) for i in ids
    )


@pytest.mark.parametrize("kind", KINDS)
def test_every_evaluation_pass_scores_each_sample_once(
    kind: str, tmp_path: Path, folder: Path
) -> None:
    loaders = _make(kind, False, tmp_path, folder)
    for _ in range(3):
        ids = [int(v) for ld in loaders for _, y in ld for v in y]
        assert sorted(ids) == list(range(N_VAL))


def test_the_rule_is_distributed_samplers() -> None:
    from torch.utils.data import DistributedSampler

    for epoch in range(3):
        for rank in range(WORLD):
            s = DistributedSampler(
                range(N_TRAIN), num_replicas=WORLD, rank=rank, seed=SEED, drop_last=True
            )
            s.set_epoch(epoch)
            got = np.concatenate(rank_batches(N_TRAIN, rank, WORLD, 1, True, SEED, epoch))
            assert got.tolist() == list(s)


@pytest.mark.parametrize("cut", [0, 1])
def test_dali_external_source_survives_the_loop_dropping_its_iterator(
    cut: int, tmp_path: Path, folder: Path
) -> None:
    """The loop never asks for the batch after the last one, so DALI's StopIteration (and
    its reset) never comes from the loop: epoch 2 must start anyway, with no batch of
    epoch 1 (cut=1: train.max_steps_per_epoch=1)."""
    loaders = _make("dali_external:none", True, tmp_path, folder)
    for epoch in range(3):
        per_rank = _epoch(loaders, epoch, max_steps=cut)
        steps = cut or len(loaders[0])
        for ids in per_rank:
            assert len(ids) == len(set(ids)) == steps * BATCH


def test_worker_affine_batches_keep_the_rules_samples(tmp_path: Path, folder: Path) -> None:
    """Cached folder loader with DataLoader workers: the rule's samples per epoch, dealt so
    that worker k % parts mostly reads its own files (i % parts) every epoch."""
    from bench.data.cached_folder import CachedFolderLoader

    parts = 2
    base = _folder_loader("cached:memory", True, 0, tmp_path, folder, BATCH)
    ld = CachedFolderLoader(
        base.ds,
        batch_size=BATCH,
        rank=0,
        world_size=WORLD,
        device=CPU,
        num_workers=parts,
        seed=SEED,
        size_at=lambda e: 16,
        strict=False,
    )  # never iterated: the plan alone, no worker processes
    for epoch in range(3):
        ld.set_epoch(epoch)
        plan = ld._plan()
        rule = rank_batches(N_TRAIN, 0, WORLD, BATCH, True, SEED, epoch)
        assert [len(b) for b in plan] == [len(b) for b in rule]
        assert sorted(np.concatenate(plan).tolist()) == sorted(np.concatenate(rule).tolist())
        home = sum(int(i) % parts == k % parts for k, b in enumerate(plan) for i in b)
        assert home >= 0.6 * len(rule) * BATCH
