"""Data sets and sharded loaders: fixed split, no duplicate or missing sample, readers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.data import build_data, validate
from bench.data.config import CacheConfig, DataConfig
from bench.registry import ConfigError

CPU = torch.device("cpu")


def _labels_seen(loader) -> list[int]:
    return [int(v) for _, y in loader for v in y]


def test_digits_split_is_fixed_and_stratified() -> None:
    from bench.data import load_digits_split

    tx, ty, vx, vy = load_digits_split(32, 0.2, 0)
    assert tx.shape[1:] == (3, 32, 32) and len(tx) + len(vx) == 1797
    assert len(vx) == 360
    counts = torch.bincount(vy, minlength=10)
    assert counts.min() >= 35  # stratified: every class about a tenth of the test set
    tx2, ty2, _, _ = load_digits_split.__wrapped__(32, 0.2, 0)
    assert torch.equal(ty, ty2)


def test_eval_shards_cover_every_sample_once() -> None:
    cfg = DataConfig(batch_size=120, eval_batch_size=64)
    seen = []
    for rank in range(3):
        b = build_data(cfg, CacheConfig(), rank, 3, CPU, 0)
        seen.append(sum(len(y) for _, y in b.eval))
    assert sum(seen) == 360


def test_train_shards_are_disjoint_and_reshuffle_per_epoch() -> None:
    cfg = DataConfig(batch_size=64, pad=0)

    # identify samples by their pixels: un-augmented images are unique per sample
    def keys(rank: int, epoch: int) -> list[int]:
        b = build_data(cfg, CacheConfig(), rank, 2, CPU, 0)
        b.train.set_epoch(epoch)
        return [hash(x.numpy().tobytes()) for xb, _ in b.train for x in xb]

    a0, b0 = keys(0, 0), keys(1, 0)
    assert not set(a0) & set(b0)
    assert len(a0) == len(b0)  # drop_last: every rank takes the same number of steps
    assert keys(0, 1) != a0  # new order each epoch


def test_cifar10_reader(cifar_dir: Path) -> None:
    cfg = DataConfig(name="cifar10", root=str(cifar_dir), batch_size=20, eval_batch_size=10)
    validate(cfg, CacheConfig(), 2)
    b = build_data(cfg, CacheConfig(), 0, 2, CPU, 0)
    assert b.num_classes == 10 and len(b.train) == 5  # 100 images / 2 ranks / 10 per step
    x, y = next(iter(b.train))
    assert x.shape == (10, 3, 32, 32) and x.dtype == torch.float32
    assert sum(len(y) for _, y in b.eval) == 10  # rank 0's half of 20 test images


def test_cifar10_without_batch_files_is_refused(tmp_path: Path, cifar_dir: Path) -> None:
    (cifar_dir / "data_batch_3").unlink()
    with pytest.raises(ConfigError, match="data_batch_3"):
        validate(DataConfig(name="cifar10", root=str(cifar_dir)), CacheConfig(), 1)
    with pytest.raises(ConfigError, match="not a directory"):
        validate(DataConfig(name="cifar10", root=str(tmp_path / "nope")), CacheConfig(), 1)


def test_imagefolder_reader(jpeg_dir: Path) -> None:
    cfg = DataConfig(
        name="imagefolder",
        root=str(jpeg_dir),
        batch_size=4,
        eval_batch_size=4,
        image_size=24,
        eval_image_size=24,
        num_classes=0,
        flip=True,
    )
    validate(cfg, CacheConfig(), 2)
    b = build_data(cfg, CacheConfig(), 1, 2, CPU, 0)
    assert b.num_classes == 3
    x, y = next(iter(b.train))
    assert x.shape == (2, 3, 24, 24)
    assert len(_labels_seen(b.eval)) == 6  # half of 12 val images


def test_empty_class_folder_and_missing_root(jpeg_dir: Path) -> None:
    (jpeg_dir / "val" / "empty").mkdir()
    with pytest.raises(ConfigError, match="empty"):
        validate(DataConfig(name="imagefolder", root=str(jpeg_dir)), CacheConfig(), 1)
    with pytest.raises(ConfigError, match="not a directory"):
        validate(DataConfig(name="imagenet", root=""), CacheConfig(), 1)


def test_batch_must_divide_over_workers() -> None:
    with pytest.raises(ConfigError, match="divisible"):
        validate(DataConfig(batch_size=100), CacheConfig(), 3)
    with pytest.raises(ConfigError, match="positive"):
        validate(DataConfig(batch_size=0), CacheConfig(), 1)


def test_synthetic_shapes() -> None:
    cfg = DataConfig(
        name="synthetic", batch_size=8, image_size=16, num_classes=7, synthetic_size=64
    )
    b = build_data(cfg, CacheConfig(), 0, 2, CPU, 0)
    x, y = next(iter(b.train))
    assert x.shape == (4, 3, 16, 16) and int(y.max()) < 7 and len(b.train) == 8


def test_choice_fields_are_refused_when_composed() -> None:
    from omegaconf import OmegaConf
    from omegaconf.errors import ValidationError

    for group, key in (
        (DataConfig, "loader"),
        (DataConfig, "dali_device"),
        (CacheConfig, "verify"),
    ):
        cfg = OmegaConf.structured(group)
        with pytest.raises(ValidationError, match="expected one of"):
            setattr(cfg, key, "bogus")


def test_data_sets_are_specs_carrying_their_check() -> None:
    from bench.data import DATASETS, DatasetSpec

    assert all(isinstance(DATASETS.get(name), DatasetSpec) for name in DATASETS)
    # each carries its pre-launch check (digits: a batch larger than its training split)
    assert DATASETS.get("cifar10").check is not None and DATASETS.get("digits").check is not None
    with pytest.raises(KeyError, match="already registered"):
        DATASETS.register("digits")(DATASETS.get("digits"))


def test_digits_split_is_prepared_once_then_read_back(tmp_path, monkeypatch):
    import torch

    import bench.data as digits

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    digits.load_digits_split.cache_clear()
    first = digits.load_digits_split(16, 0.2, 0)
    (saved,) = (tmp_path / "cache").glob("digits-*-16-0.2-0.pt")
    digits.load_digits_split.cache_clear()
    monkeypatch.setattr(digits, "_prepare", lambda *a: pytest.fail("prepared again"))
    again = digits.load_digits_split(16, 0.2, 0)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    monkeypatch.undo()  # _prepare back
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    saved.write_bytes(b"truncated")  # a broken cache is prepared again and replaced
    digits.load_digits_split.cache_clear()
    assert all(torch.equal(a, b) for a, b in zip(first, digits.load_digits_split(16, 0.2, 0)))
    assert saved.stat().st_size > 1000
    monkeypatch.setenv("BENCH_CACHE_DIR", str(saved))  # a file: the cache cannot be written
    digits.load_digits_split.cache_clear()
    assert all(torch.equal(a, b) for a, b in zip(first, digits.load_digits_split(16, 0.2, 0)))
    digits.load_digits_split.cache_clear()
