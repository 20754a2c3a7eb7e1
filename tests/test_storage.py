"""Level 0: the slow-storage emulator's link is one per node; page-cache eviction; versions."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import pytest

from bench.data.storage import (
    LocalStorage,
    drop_page_cache,
    link_path,
    open_storage,
    resident_fraction,
)

FILE_KB = 50  # four files of 50 KB per reader


@pytest.fixture
def blobs(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("BENCH_LINK_DIR", str(tmp_path / "links"))  # no link shared with others
    root = tmp_path / "data"
    root.mkdir()
    for i in range(4):
        (root / f"{i}.bin").write_bytes(os.urandom(FILE_KB * 1000))
    return root


def _read_all(root: str, mbps: float, ms: float, barrier, times, slot: int) -> None:
    store = open_storage(root, bandwidth_mbps=mbps, latency_ms=ms)  # each rank opens its own
    barrier.wait()
    times[2 * slot] = time.monotonic()  # one clock for every process of the host
    for name in sorted(os.listdir(root)):
        store.read(name)
    times[2 * slot + 1] = time.monotonic()


def test_two_processes_share_one_link(blobs: Path) -> None:
    """Two ranks that each open the throttled storage get the budget together, not twice it."""
    mbps = 1.0  # 1 MB/s: 2 x 200 KB take >= 0.4 s on one shared link, 0.2 s on two links
    ctx = mp.get_context("fork")
    barrier, times = ctx.Barrier(2), ctx.Array("d", 4)
    procs = [
        ctx.Process(target=_read_all, args=(str(blobs), mbps, 0.0, barrier, times, k))
        for k in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    span = max(times[1], times[3]) - min(times[0], times[2])
    total = 2 * 4 * FILE_KB * 1000
    assert span >= 0.95 * total / (mbps * 1e6), f"{span:.3f} s: each rank had a link of its own"
    assert span < 4 * total / (mbps * 1e6)


def test_threads_share_the_link_and_overlap_latency(blobs: Path) -> None:
    """Four threads split the bandwidth; their per-file latencies overlap (outstanding reads)."""
    names = sorted(os.listdir(blobs))
    store = open_storage(str(blobs), bandwidth_mbps=2.0, latency_ms=0.0)

    def run(store) -> float:
        t0 = time.monotonic()
        threads = [
            threading.Thread(target=lambda: [store.read(n) for n in names]) for _ in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.monotonic() - t0

    total = 4 * 4 * FILE_KB * 1000
    assert run(store) >= 0.95 * total / 2e6  # 800 KB at 2 MB/s: >= 0.4 s
    store = open_storage(str(blobs), bandwidth_mbps=0.0, latency_ms=50.0)
    # 16 reads of 50 ms: 0.8 s one after the other, 0.2 s when the four threads overlap
    assert 0.19 <= run(store) < 0.6


def test_link_is_per_node_root_and_setting(monkeypatch) -> None:
    monkeypatch.setenv("GROUP_RANK", "0")
    a = link_path("/data", 50.0, 5.0)
    assert a == link_path("/data", 50.0, 5.0)
    assert a != link_path("/other", 50.0, 5.0) and a != link_path("/data", 25.0, 5.0)
    monkeypatch.setenv("GROUP_RANK", "1")  # an emulated second node on the same host
    assert a != link_path("/data", 50.0, 5.0)


def _on_tmpfs(path: Path) -> bool:
    best, kind = "", ""
    with open("/proc/mounts") as f:
        for line in f:
            _, mnt, fs = line.split()[:3]
            if str(path).startswith(mnt) and len(mnt) > len(best):
                best, kind = mnt, fs
    return kind in ("tmpfs", "ramfs")


@pytest.mark.skipif(not os.path.exists("/proc/mounts"), reason="needs Linux (mincore)")
def test_drop_page_cache(tmp_path: Path) -> None:
    if _on_tmpfs(tmp_path):
        pytest.skip("the temp dir is in memory: its pages cannot be dropped")
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(4 << 20))
    path.read_bytes()
    drop_page_cache([str(tmp_path)])  # a folder: every file below it
    assert resident_fraction([str(path)]) < 0.1
    path.read_bytes()
    assert resident_fraction([str(path)]) > 0.9


def test_local_version_follows_the_file(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"1234")
    store = LocalStorage(str(tmp_path))
    v1 = store.version("a.jpg")
    assert v1 is not None and v1[0] == 4
    os.utime(tmp_path / "a.jpg", ns=(v1[1] + 10**9, v1[1] + 10**9))  # touched, same size
    assert store.version("a.jpg") != v1
    assert store.version("missing.jpg") is None
