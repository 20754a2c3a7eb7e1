"""The multi-level cache: identical bytes, verification, eviction, locking, bad directories,
one cap for all the processes of a node, changed sources, pre-decoded pixels."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.data.cache import CacheStats, DiskCache, MemoryCache, build_reader, validate_cache
from bench.data.jpegs import make_jpeg_folder
from bench.data.storage import LocalStorage, list_folder, open_storage
from bench.registry import ConfigError


def cache_cfg(name: str, d: Path, **kw) -> SimpleNamespace:
    base = dict(
        name=name, dir=str(d), disk_gb=1.0, memory_gb=1.0, predecode_size=24, verify="crc32"
    )
    return SimpleNamespace(**{**base, **kw})


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("jpegs")
    make_jpeg_folder(str(root), 24, 3, "train", small=True)
    make_jpeg_folder(str(root), 12, 3, "val", small=True, seed=1)
    return root


@pytest.mark.parametrize("name", ["none", "disk", "memory", "multilevel"])
def test_cache_returns_source_bytes(folder: Path, tmp_path: Path, name: str) -> None:
    store = LocalStorage(str(folder))
    listing = list_folder(store, "train")
    reader = build_reader(store, cache_cfg(name, tmp_path / "c"), str(folder))
    for _ in range(2):  # first pass fills the levels, second pass reads them
        for rel in listing.files:
            assert reader.get(rel) == (folder / rel).read_bytes()
    st = reader.stats.take()
    n = len(listing)
    assert st["cache/misses"] == (2 * n if name == "none" else n)
    assert st.get("cache/hits", 0) == (0 if name == "none" else n)
    assert st["cache/bytes_l0"] == sum((folder / r).stat().st_size for r in listing.files) * (
        2 if name == "none" else 1
    )


def test_truncated_cache_file_is_refetched(folder: Path, tmp_path: Path) -> None:
    store = LocalStorage(str(folder))
    rel = list_folder(store, "train").files[0]
    reader = build_reader(store, cache_cfg("disk", tmp_path / "c"), str(folder))
    src = (folder / rel).read_bytes()
    assert reader.get(rel) == src
    path = reader.disk.file_for(rel)
    raw = Path(path).read_bytes()
    Path(path).write_bytes(raw[: len(raw) // 2])  # a crash mid-write would leave this
    reader.stats.take()
    assert reader.get(rel) == src
    st = reader.stats.take()
    assert st["cache/refetched"] == 1 and st["cache/misses"] == 1
    # a flipped byte of the same length is caught by the CRC
    raw = bytearray(Path(path).read_bytes())
    raw[-1] ^= 0xFF
    Path(path).write_bytes(bytes(raw))
    assert reader.get(rel) == src
    assert reader.stats.take()["cache/refetched"] == 1
    assert reader.get(rel) == src and reader.stats.take()["cache/hits_l1"] == 1


def test_disk_cap_and_lru_eviction(tmp_path: Path) -> None:
    stats = CacheStats()
    disk = DiskCache(str(tmp_path / "c"), cap_bytes=10_000, namespace="x", stats=stats)
    blob = os.urandom(1_000)
    for i in range(5):
        disk.put(f"k{i}", blob)
    old = time.time() - 100
    for i in range(5):  # k0 is the most recently used, k1..k4 are older
        os.utime(disk.file_for(f"k{i}"), (old + i, old + i))
    assert disk.get("k0") == blob  # touches k0
    for i in range(5, 10):  # the 10th file passes the cap: evict down to 90 %
        disk.put(f"k{i}", blob)
    assert disk.usage() <= 10_000
    assert disk.get("k1") is None  # least recently used: evicted
    assert disk.get("k0") == blob  # used recently: kept
    assert stats.take()["cache/evicted"] == 2
    for i in range(10, 30):
        disk.put(f"k{i}", blob)
        assert disk.usage() <= 10_000
    disk.put("huge", os.urandom(20_000))  # larger than the cap: never stored
    assert disk.get("huge") is None


CAP = 20_000  # bytes: the directory cap shared by the writers below


def _write_capped(cdir: str, seed: int, violations) -> None:
    import random

    disk = DiskCache(cdir, cap_bytes=CAP, namespace="shared", stats=CacheStats())
    rng = random.Random(seed)
    for i in range(40):
        disk.put(f"p{seed}-{i}", os.urandom(rng.randint(600, 1_200)))
        if disk.usage() > CAP:  # a scan under the ledger's lock: a consistent picture
            with violations.get_lock():
                violations.value += 1


def test_disk_cap_holds_across_processes(tmp_path: Path) -> None:
    """Four processes writing into one capped directory: the cap holds for the directory."""
    ctx = mp.get_context("fork")
    violations = ctx.Value("i", 0)
    procs = [
        ctx.Process(target=_write_capped, args=(str(tmp_path / "c"), s, violations))
        for s in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    disk = DiskCache(str(tmp_path / "c"), cap_bytes=CAP, namespace="shared", stats=CacheStats())
    assert disk.usage() <= CAP
    assert violations.value == 0
    with disk._usage() as used:  # the ledger agrees with the files on disk
        assert used[0] == disk._scan_usage()


def test_cache_tree_scanned_once_per_node(tmp_path: Path, monkeypatch) -> None:
    """Every worker of every rank builds a DiskCache; only the first one scans the tree."""
    scans = []
    real = DiskCache._scan_usage
    monkeypatch.setattr(DiskCache, "_scan_usage", lambda self: scans.append(1) or real(self))
    first = DiskCache(str(tmp_path / "c"), cap_bytes=10**6, namespace="x", stats=CacheStats())
    first.put("a", b"x" * 100)
    for _ in range(3):
        DiskCache(str(tmp_path / "c"), cap_bytes=10**6, namespace="x", stats=CacheStats())
    assert len(scans) == 1


def test_changed_source_is_refetched(folder: Path, tmp_path: Path) -> None:
    """A level 1 copy of an older version of a file (size and mtime differ) is not served."""
    src = tmp_path / "src"
    rel = "train/c0000/a.jpg"
    (src / "train" / "c0000").mkdir(parents=True)
    (src / rel).write_bytes(b"old" * 100)
    store = LocalStorage(str(src))
    reader = build_reader(store, cache_cfg("disk", tmp_path / "c"), str(src))
    assert reader.get(rel) == b"old" * 100
    mtime = (src / rel).stat().st_mtime_ns
    (src / rel).write_bytes(b"new" * 100)  # same size: only the mtime tells
    os.utime(src / rel, ns=(mtime + 10**9, mtime + 10**9))
    reader.stats.take()
    assert reader.get(rel) == b"new" * 100
    st = reader.stats.take()
    assert st["cache/refetched"] == 1 and st["cache/misses"] == 1
    assert reader.get(rel) == b"new" * 100 and reader.stats.take()["cache/hits_l1"] == 1


def test_predecoded_keeps_the_original_pixels(folder: Path, tmp_path: Path) -> None:
    """Pre-decoding stores what the uncached path decodes: no lower resolution by default."""
    import numpy as np
    from PIL import Image

    store = LocalStorage(str(folder))
    rel = list_folder(store, "train").files[0]
    full = np.array(Image.open(folder / rel).convert("RGB"))  # a full decode
    cfg = cache_cfg("predecoded", tmp_path / "c", predecode_size=0)  # 0 = original size
    reader = build_reader(store, cfg, str(folder))
    # the loaders pass 8/7 x the training size; the configured cap (none) decides
    arr = reader.get_decoded(rel, 256)
    assert arr.shape == full.shape and np.array_equal(arr, full)
    assert reader.stats.take()["cache/bytes_decoded"] == full.nbytes  # the memory cost
    capped = build_reader(
        store, cache_cfg("predecoded", tmp_path / "d", predecode_size=24), str(folder)
    )
    assert min(capped.get_decoded(rel, 24).shape[:2]) == 24  # shrunk to the cap
    big = build_reader(
        store, cache_cfg("predecoded", tmp_path / "e", predecode_size=1000), str(folder)
    )
    assert np.array_equal(big.get_decoded(rel, 1000), full)  # never upsampled


def test_memory_cache_cap_and_lru() -> None:
    m = MemoryCache(cap_bytes=3_000)
    for i in range(3):
        m.put(str(i), b"x" * 1_000)
    assert m.get("0") is not None  # 0 becomes most recent
    m.put("3", b"y" * 1_000)
    assert m.get("1") is None and m.get("0") is not None and m.nbytes <= 3_000


class CountingStorage(LocalStorage):
    """Counts level-0 reads in a shared counter (to check one fetch per file per node)."""

    def __init__(self, root: str, counter) -> None:
        super().__init__(root)
        self.counter = counter

    def read(self, rel: str) -> bytes:
        with self.counter.get_lock():
            self.counter.value += 1
        time.sleep(0.002)  # widen the window in which two processes could both fetch
        return super().read(rel)


def _fill(root: str, cdir: str, counter, files: list[str], seed: int) -> None:
    import random

    store = CountingStorage(root, counter)
    reader = build_reader(store, cache_cfg("disk", Path(cdir)), root)
    order = list(files)
    random.Random(seed).shuffle(order)
    for rel in order:
        assert reader.get(rel) == Path(root, rel).read_bytes()


def test_two_processes_share_disk_cache(folder: Path, tmp_path: Path) -> None:
    files = list_folder(LocalStorage(str(folder)), "train").files
    ctx = mp.get_context("fork")
    counter = ctx.Value("i", 0)
    procs = [
        ctx.Process(target=_fill, args=(str(folder), str(tmp_path / "c"), counter, files, s))
        for s in (1, 2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert counter.value == len(files)  # every file fetched exactly once on this node
    reader = build_reader(LocalStorage(str(folder)), cache_cfg("disk", tmp_path / "c"), str(folder))
    for rel in files:  # every cached file verifies
        assert reader.disk.get(rel) == (folder / rel).read_bytes()
    assert not [n for _, _, ns in os.walk(tmp_path / "c") for n in ns if n.startswith(".tmp-")]


def test_unwritable_cache_dir(folder: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    bad = blocker / "cache"  # cannot be created, even by root
    with pytest.raises(ConfigError, match="not writable"):
        validate_cache(cache_cfg("disk", bad))
    store = LocalStorage(str(folder))
    rel = list_folder(store, "train").files[0]
    with pytest.warns(UserWarning, match="level 1"):
        reader = build_reader(store, cache_cfg("multilevel", bad), str(folder))
    assert reader.get(rel) == (folder / rel).read_bytes()  # still served, from level 0


def test_full_cache_dir_turns_level1_off(folder: Path, tmp_path: Path, monkeypatch) -> None:
    store = LocalStorage(str(folder))
    files = list_folder(store, "train").files
    reader = build_reader(store, cache_cfg("disk", tmp_path / "c"), str(folder))

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.warns(UserWarning, match="is full"):
        assert reader.get(files[0]) == (folder / files[0]).read_bytes()
    assert not reader.disk.writable
    assert reader.get(files[1]) == (folder / files[1]).read_bytes()
    assert not [n for _, _, ns in os.walk(tmp_path / "c") for n in ns if n.startswith(".tmp-")]


def test_throttle_slows_reads(folder: Path) -> None:
    files = list_folder(LocalStorage(str(folder)), "train").files[:10]
    store = open_storage(str(folder), bandwidth_mbps=0, latency_ms=20)
    t0 = time.perf_counter()
    for rel in files:
        store.read(rel)
    assert time.perf_counter() - t0 >= 10 * 0.020
    store = open_storage(str(folder), bandwidth_mbps=0.05, latency_ms=0)  # 50 KB/s
    t0 = time.perf_counter()
    n = sum(len(store.read(rel)) for rel in files[:3])
    assert time.perf_counter() - t0 >= n / 50_000 * 0.95


def test_listing_errors(tmp_path: Path, folder: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        list_folder(LocalStorage(str(tmp_path / "missing")), "train")
    with pytest.raises(ConfigError, match="does not exist"):
        list_folder(LocalStorage(str(folder)), "nope")
    (tmp_path / "d" / "train" / "empty").mkdir(parents=True)
    (tmp_path / "d" / "train" / "full").mkdir()
    src = next((folder / "train").rglob("*.jpg"))
    (tmp_path / "d" / "train" / "full" / "a.jpg").write_bytes(src.read_bytes())
    with pytest.warns(UserWarning, match="hold no images: empty"):
        lst = list_folder(LocalStorage(str(tmp_path / "d")), "train")
    assert lst.classes == ["empty", "full"] and lst.labels == [1]


def test_fsspec_storage(folder: Path) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    files = list_folder(LocalStorage(str(folder)), "train").files
    for rel in files:
        fs.pipe(f"/ds/{rel}", (folder / rel).read_bytes())
    store = open_storage("memory://ds")
    lst = list_folder(store, "train")
    assert lst.files == files
    assert store.read(files[0]) == (folder / files[0]).read_bytes()
    v = store.version(files[0])  # from the listing: no request per cache hit
    assert v is not None and v[0] == (folder / files[0]).stat().st_size
    time.sleep(0.01)
    fs.pipe(f"/ds/{files[0]}", b"changed")
    assert open_storage("memory://ds").version(files[0]) != v  # the next run sees it


def test_predecoded_evaluation_sees_the_uncached_pixels(folder: Path, tmp_path: Path) -> None:
    """The torch evaluation batches are the same with and without the pre-decoded level."""
    import torch

    from bench.data.cached_folder import build_folder
    from bench.data.config import CacheConfig, DataConfig

    d = DataConfig(name="imagefolder", root=str(folder), batch_size=4, eval_batch_size=4,
                   image_size=32, eval_image_size=32, num_classes=0, num_workers=0)  # fmt: skip
    batches = {}
    for name in ("none", "predecoded"):
        c = CacheConfig(name=name, dir=str(tmp_path / name), disk_gb=1.0, memory_gb=1.0)
        bundle = build_folder(d, c, 0, 1, torch.device("cpu"), 0)
        batches[name] = [x for x, _ in bundle.eval]
        bundle.train.close()
        bundle.eval.close()
    assert len(batches["none"]) == len(batches["predecoded"]) > 0
    for a, b in zip(batches["none"], batches["predecoded"], strict=True):
        assert torch.equal(a, b)
