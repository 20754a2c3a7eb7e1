"""Input pipelines over generated JPEG folders: DALI (the cached external source) and
the cache-backed torch DataLoader yield every sample once per epoch across shards; corrupt
files are skipped (or stop the run in strict mode); progressive resizing; build_data."""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bench.data.cache import build_reader
from bench.data.cached_folder import CachedFolderLoader, FolderDataset
from bench.data.jpegs import CorruptImage, make_jpeg_folder
from bench.data.storage import LocalStorage, list_folder, open_storage
from tests.helpers.corrupt import corrupt_files

CPU = torch.device("cpu")


def ccfg(name: str, d: Path, **kw) -> SimpleNamespace:
    return SimpleNamespace(
        **{
            **dict(
                name=name, dir=str(d), disk_gb=1.0, memory_gb=1.0, predecode_size=24, verify="crc32"
            ),
            **kw,
        }
    )


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jpegs")
    make_jpeg_folder(str(root), 37, 4, "train", small=True)  # 37: uneven over 3 shards
    make_jpeg_folder(str(root), 23, 4, "val", small=True, seed=1)
    return root


def dali_loader(
    folder: Path,
    split: str,
    *,
    cache: str,
    rank: int,
    world: int,
    train: bool,
    tmp: Path,
    batch: int = 4,
    size_at=lambda e: 16,
    strict: bool = False,
):
    from bench.data.dali import DaliFolderLoader

    store = LocalStorage(str(folder))
    listing = list_folder(store, split)
    cfg = ccfg(cache, tmp)
    return DaliFolderLoader(
        listing,
        reader=build_reader(store, cfg, str(folder)),
        train=train,
        batch_size=batch,
        rank=rank,
        world_size=world,
        device=CPU,
        threads=1,
        prefetch=2,
        seed=3,
        size_at=size_at,
        flip=True,
        strict=strict,
        predecode_size=24 if cache == "predecoded" else 0,
    )


def torch_loader(
    folder: Path,
    split: str,
    *,
    cache: str,
    rank: int,
    world: int,
    train: bool,
    tmp: Path,
    batch: int = 4,
    workers: int = 0,
    size_at=lambda e: 16,
    strict: bool = False,
    throttle_ms: float = 0.0,
):
    store = open_storage(str(folder), 0.0, throttle_ms)  # throttled: shared with the workers
    ds = FolderDataset(
        store,
        list_folder(store, split),
        ccfg(cache, tmp),
        str(folder),
        train,
        True,
        24,
        max(1, workers),
    )
    return CachedFolderLoader(
        ds,
        batch_size=batch,
        rank=rank,
        world_size=world,
        device=CPU,
        num_workers=workers,
        seed=3,
        size_at=size_at,
        strict=strict,
    )


def epoch_indices(loader, epoch: int) -> tuple[list[int], list[torch.Size]]:
    loader.set_epoch(epoch)
    ids, shapes, steps = [], [], 0
    for x, y, idx in loader.iter_indexed():
        assert x.dtype == torch.float32 and x.shape[0] == len(y) == len(idx)
        ids += idx.tolist()
        shapes.append(x.shape)
        steps += 1
    assert steps == len(loader)
    return ids, shapes


def check_cover(per_rank: list[list[int]], n: int, exact: bool, spare: int = 0) -> None:
    flat = [i for ids in per_rank for i in ids]
    assert len(flat) - len(set(flat)) <= spare, "a sample was yielded twice in one epoch"
    if exact:
        assert sorted(set(flat)) == list(range(n)), "samples missing from the epoch"


@pytest.mark.parametrize("train", [False, True])
def test_torch_path_shards_cover_each_sample_once(
    folder: Path, tmp_path: Path, train: bool
) -> None:
    world, split = 3, "train" if train else "val"
    n = 37 if train else 23
    loaders = [
        torch_loader(folder, split, cache="memory", rank=r, world=world, train=train, tmp=tmp_path)
        for r in range(world)
    ]
    for epoch in range(2):
        per_rank = [epoch_indices(ld, epoch)[0] for ld in loaders]
        # training drops the partial batches (drop_last) and n % world; evaluation is exact
        check_cover(per_rank, n, exact=not train)
        if train:
            assert len({len(ids) for ids in per_rank}) == 1  # same steps on every rank
            assert len({len(ld) for ld in loaders}) == 1


@pytest.mark.parametrize("cache", ["none", "multilevel", "predecoded"])
@pytest.mark.parametrize("train", [False, True])
def test_dali_shards_cover_each_sample_once(
    folder: Path, tmp_path: Path, cache: str, train: bool
) -> None:
    pytest.importorskip("nvidia.dali")
    world, split = 3, "train" if train else "val"
    n = 37 if train else 23
    loaders = [
        dali_loader(folder, split, cache=cache, rank=r, world=world, train=train, tmp=tmp_path)
        for r in range(world)
    ]
    for epoch in range(3):
        per_rank = [epoch_indices(ld, epoch)[0] for ld in loaders]
        # one rule for every loader (bench.data.loaders): training drops the partial
        # batches and n % world (they change every epoch), evaluation is exact; no repeats
        check_cover(per_rank, n, exact=not train)
        if train:
            assert len({len(ids) for ids in per_rank}) == 1  # same steps on every rank
        stats = loaders[0].epoch_stats()
        if cache != "none" and epoch > 0:
            assert stats["cache/hits"] > 0


def test_dali_and_torch_eval_yield_the_same_samples(folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali")
    seen: dict[str, list[int]] = {"torch": [], "dali": []}
    for rank in range(2):
        t = torch_loader(folder, "val", cache="none", rank=rank, world=2, train=False, tmp=tmp_path)
        d = dali_loader(folder, "val", cache="none", rank=rank, world=2, train=False, tmp=tmp_path)
        ti, di = (epoch_indices(x, 0)[0] for x in (t, d))
        assert ti == di  # same shard, same order
        seen["torch"] += ti
        seen["dali"] += di
    for ids in seen.values():
        assert sorted(ids) == list(range(23))


def test_eval_images_match_between_dali_and_torch(folder: Path, tmp_path: Path) -> None:
    """Same resize + centre crop + normalisation: images agree up to resampling details."""
    pytest.importorskip("nvidia.dali")
    t = torch_loader(
        folder, "val", cache="none", rank=0, world=1, train=False, tmp=tmp_path, batch=8
    )
    d = dali_loader(
        folder,
        "val",
        cache="none",
        rank=0,
        world=1,
        train=False,
        tmp=tmp_path,
        batch=8,
    )
    xt, _, it = next(iter(t.iter_indexed()))
    xd, _, id_ = next(iter(d.iter_indexed()))
    assert it.tolist() == id_.tolist()
    assert (xt - xd).abs().mean() < 0.25  # normalised units; unrelated images differ by ~1


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[Path, list[str]]:
    root = tmp_path / "bad"
    make_jpeg_folder(str(root), 12, 2, "train", small=True)
    return root, corrupt_files(str(root))


def test_torch_path_skips_corrupt_images(damaged, tmp_path: Path) -> None:
    root, bad = damaged
    ld = torch_loader(root, "train", cache="none", rank=0, world=1, train=False, tmp=tmp_path)
    with pytest.warns(UserWarning) as rec:
        ids, _ = epoch_indices(ld, 0)
    msgs = " ".join(str(w.message) for w in rec)
    assert all(b in msgs for b in bad)
    assert len(ids) == 10 and ld.epoch_stats()["data/corrupt"] == 2
    strict = torch_loader(
        root, "train", cache="none", rank=0, world=1, train=False, tmp=tmp_path, strict=True
    )
    with pytest.raises(CorruptImage, match=bad[0].split("/")[-1]):
        epoch_indices(strict, 0)


def test_dali_skips_corrupt_images(damaged, tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali")
    root, bad = damaged
    with pytest.warns(UserWarning) as rec:
        ld = dali_loader(root, "train", cache="disk", rank=0, world=1, train=False, tmp=tmp_path)
        ids, _ = epoch_indices(ld, 0)
    msgs = " ".join(str(w.message) for w in rec)
    assert all(b in msgs for b in bad)
    assert len(ids) == 10 and ld.epoch_stats()["data/corrupt"] == 2
    with pytest.raises(CorruptImage, match="strict"):
        ld = dali_loader(
            root,
            "train",
            cache="none",
            rank=0,
            world=1,
            train=False,
            tmp=tmp_path,
            strict=True,
        )
        epoch_indices(ld, 0)


@pytest.mark.parametrize("kind", ["torch", "dali"])
def test_progressive_resizing(folder: Path, tmp_path: Path, kind: str) -> None:
    from bench.data.config import DataConfig, train_size_at

    cfg = DataConfig(image_size=32, progressive=[[0, 16], [1, 24], [2, 32]])
    size_at = lambda e: train_size_at(cfg, e)  # noqa: E731
    if kind == "dali":
        pytest.importorskip("nvidia.dali")
        ld = dali_loader(
            folder,
            "train",
            cache="predecoded",
            rank=0,
            world=1,
            train=True,
            tmp=tmp_path,
            size_at=size_at,
        )
    else:
        ld = torch_loader(
            folder,
            "train",
            cache="predecoded",
            rank=0,
            world=1,
            train=True,
            tmp=tmp_path,
            workers=2,
            size_at=size_at,
            throttle_ms=1.0,
        )
    for epoch, size in [(0, 16), (1, 24), (2, 32), (3, 32)]:
        _, shapes = epoch_indices(ld, epoch)
        assert {tuple(s[1:]) for s in shapes} == {(3, size, size)}


@pytest.mark.parametrize(
    "loader,cache",
    [("torch", "multilevel"), ("dali", "multilevel"), ("dali", "none"), ("torch", "none")],
)
def test_build_data_imagefolder(folder: Path, tmp_path: Path, loader: str, cache: str) -> None:
    if loader == "dali":
        pytest.importorskip("nvidia.dali")
    from bench.data import build_data, validate
    from bench.data.config import CacheConfig, DataConfig

    d = DataConfig(
        name="imagefolder",
        root=str(folder),
        batch_size=8,
        eval_batch_size=8,
        image_size=16,
        eval_image_size=16,
        num_classes=0,
        loader=loader,
        num_workers=0,
        flip=True,
        throttle_ms=1.0 if cache != "none" else 0.0,
    )
    c = CacheConfig(name=cache, dir=str(tmp_path / "c"))
    validate(d, c, 2)
    b = build_data(d, c, 1, 2, CPU, 0)
    assert b.num_classes == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the folder is clean: no warnings
        for loader_ in (b.train, b.eval):
            loader_.set_epoch(0)
            batches = list(loader_)
            assert len(batches) == len(loader_)
            x, y = batches[0]
            assert x.shape[1:] == (3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.long
            assert y.max() < 4
        stats = b.train.epoch_stats()
    assert "cache/hits" in stats and "data/corrupt" in stats


def test_validate_refuses_bad_input_settings(folder: Path, tmp_path: Path) -> None:
    from bench.data import validate
    from bench.data.config import CacheConfig, DataConfig
    from bench.registry import ConfigError

    d = DataConfig(
        name="imagefolder", root=str(folder), batch_size=8, image_size=16, eval_image_size=16
    )
    blocker = tmp_path / "f"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="not writable"):
        validate(d, CacheConfig(name="disk", dir=str(blocker / "c")), 1)
    with pytest.raises(ConfigError, match="unknown cache"):
        validate(d, CacheConfig(name="ssd"), 1)
    d.progressive = [[0, -1]]
    with pytest.raises(ConfigError, match="progressive"):
        validate(d, CacheConfig(), 1)


def test_dali_is_refused_for_data_sets_batched_in_memory() -> None:
    from bench.data import validate
    from bench.data.config import CacheConfig, DataConfig
    from bench.registry import ConfigError

    with pytest.raises(ConfigError, match="data.loader=dali reads image folders; data=digits"):
        validate(DataConfig(name="digits", loader="dali"), CacheConfig(), 1)


def test_dali_device_choice() -> None:
    pytest.importorskip("nvidia.dali")
    from bench.data.dali import dali_device_id
    from bench.registry import ConfigError

    assert dali_device_id(CPU, "auto") is None  # training on the CPU: a CPU pipeline
    assert dali_device_id(torch.device("cuda", 1), "auto") == 1  # the training GPU
    assert dali_device_id(torch.device("cuda", 1), "gpu") == 1
    assert dali_device_id(torch.device("cuda", 1), "cpu") is None
    with pytest.raises(ConfigError, match="needs a CUDA"):
        dali_device_id(CPU, "gpu")
    with pytest.raises(ConfigError, match="dali_device"):
        dali_device_id(CPU, "tpu")


def graph_ops(node, acc=None) -> list[tuple[str, str, str]]:
    """(operator, its backend, output device) of every node a DALI output depends on."""
    acc = [] if acc is None else acc
    op = node.source._op
    acc.append((type(op).__name__, op.device, node.device))
    for i in node.source.inputs:
        graph_ops(i, acc)
    return acc


@pytest.mark.parametrize("cache", ["none", "multilevel", "predecoded"])
@pytest.mark.parametrize("train", [True, False])
def test_dali_cuda_graph_decodes_mixed_and_augments_on_the_gpu(
    folder: Path, tmp_path: Path, cache: str, train: bool
) -> None:
    """On a CUDA device (the graph only: defining it needs no GPU) JPEGs are decoded by
    the ``mixed`` decoder and every later operator runs on the GPU; pre-decoded pixels go
    to the GPU right after the external source; the sample indices stay on the host."""
    pytest.importorskip("nvidia.dali")
    split = "train" if train else "val"
    ld = dali_loader(folder, split, cache=cache, rank=0, world=1, train=train, tmp=tmp_path)
    ld.device_id = 0  # what dali_device_id gives for cuda:0 (test_dali_device_choice)
    pipe = ld._external_pipe(16)
    assert pipe.device_id == 0
    pipe._build_graph()
    images, index = pipe._graph_out
    ops = graph_ops(images)
    assert ops[0] == ("CropMirrorNormalize", "gpu", "gpu")
    decoders = [(op, be) for op, be, _ in ops if op in ("Image", "ImageRandomCrop")]
    if cache == "predecoded":
        assert decoders == [] and ("ExternalSource", "cpu", "gpu") in ops
        assert ("RandomResizedCrop" if train else "Resize", "gpu", "gpu") in ops
    else:
        assert decoders == [("ImageRandomCrop" if train else "Image", "mixed")]
    on_host = {"ExternalSource", "CoinFlip"}  # sources and random draws
    assert all(dev == "gpu" for op, _, dev in ops if op not in on_host), ops
    assert index.device == "cpu"
    ld.close()


def test_dali_batches_stay_valid_after_later_batches(folder: Path, tmp_path: Path) -> None:
    """Batches handed over without a copy (DLPack, no_copy external source) are the
    caller's: later batches and epochs never overwrite them; reading the cached bytes in
    place gives exactly the pixels of the first pass, read from the files."""
    pytest.importorskip("nvidia.dali")
    for cache in ("predecoded", "multilevel"):
        ld = dali_loader(
            folder, "train", cache=cache, rank=0, world=1, train=True, tmp=tmp_path / cache
        )
        kept = []
        for epoch in range(2):
            ld.set_epoch(epoch)
            for x, _, _ in ld.iter_indexed():
                kept.append((x, x.clone()))
        assert len(kept) == 2 * len(ld)
        for x, copy in kept:
            assert torch.equal(x, copy)
        ld.close()
    ld = dali_loader(folder, "val", cache="memory", rank=0, world=1, train=False, tmp=tmp_path)
    ev = [torch.cat([x for x, _, _ in ld.iter_indexed()]) for _ in range(2)]
    assert ld.epoch_stats()["cache/hits_l2"] == 23  # the second pass, from level 2
    assert torch.equal(ev[0], ev[1])
