"""Nothing lost under faults: a killed launcher, non-finite config numbers, short writes,
a full disk, damaged images and damaged checkpoints.  Each case ends with one line, whole
lines in ``runs.jsonl`` (earlier ones byte for byte), and no temporary file left."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from bench.results import records
from bench.train import checkpoint as ck
from tests.conftest import TINY, run_cli
from tests.test_fault_tolerance import _start, _wait_checkpoint, _workers


@pytest.mark.slow
def test_a_sigkilled_single_node_launcher_takes_its_workers_and_the_run_resumes(
    tmp_path: Path,
) -> None:
    proc = _start(tmp_path, "train.epochs=3")
    _wait_checkpoint(tmp_path, 1, proc, 300)
    assert _workers(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _workers(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _workers(tmp_path)
    for pid in left:  # no stray trainer outlives a failing test
        os.kill(pid, signal.SIGKILL)
    assert not left, "workers outlived their launcher"
    out = proc.stdout.read()  # type: ignore[union-attr]
    assert "its launcher" in out and "resume=" in out, out[-3000:]
    time.sleep(2)  # a surviving worker would append its record now
    assert records.load_records(tmp_path) == []  # killed: no record claims it finished
    (run_dir,) = (tmp_path / "checkpoints").iterdir()
    assert ck.latest(tmp_path, run_dir.name) is not None
    p = run_cli("train", f"resume={run_dir.name}", f"results.dir={tmp_path}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (final,) = records.load_records(tmp_path)
    assert final["run_id"] == run_dir.name and final["epochs_run"] == 3


@pytest.fixture
def one_process_world(tmp_path: Path):
    """A world of one (gloo), for the tests that build tests.test_checkpoint's state: its DDP
    and comm hook run as in a training worker."""
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def _config(tmp_path: Path, *overrides: str):
    from hydra import compose, initialize_config_dir

    from bench.config import register_configs, to_object
    from tests.conftest import REPO

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"results.dir={tmp_path}", *overrides])
    return to_object(cfg)


@pytest.mark.parametrize(
    "override",
    ["optim.lr=inf", "optim.momentum=nan", "optim.weight_decay=nan", "optim.warmup_epochs=nan"],
)
def test_a_non_finite_config_number_is_refused_by_validation(tmp_path: Path, override: str) -> None:
    from bench.launch.run import validate
    from bench.registry import ConfigError

    with pytest.raises(ConfigError, match=rf"not a finite number: {override}"):
        validate(_config(tmp_path, override))


def test_a_non_finite_config_number_stops_the_cli_with_one_line(tmp_path: Path) -> None:
    p = run_cli("train", f"results.dir={tmp_path}", "optim.lr=inf", timeout=120)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "optim.lr=inf" in err[0], p.stderr
    assert not records.runs_path(tmp_path).exists()


def test_the_record_writer_keeps_a_record_it_cannot_encode_exactly(tmp_path: Path) -> None:
    import json

    import numpy as np

    records.append_record(tmp_path, {"run_id": "old", "status": "ok"})
    before = records.runs_path(tmp_path).read_bytes()
    rec = {
        "run_id": "r",
        "status": "error",
        "best_value": float("nan"),
        "config": {"optim": {"lr": float("inf")}},
        "curve": [np.float32(-np.inf), 1.0],
        "odd": object(),
    }
    with pytest.warns(UserWarning, match="recorded as strings"):
        records.append_record(tmp_path, rec)
    text = records.runs_path(tmp_path).read_bytes()
    assert text.startswith(before)
    line = json.loads(text[len(before) :])  # strict JSON: no NaN/Infinity tokens
    assert line["best_value"] == "nan" and line["config"]["optim"]["lr"] == "inf"
    assert line["curve"] == ["-inf", 1.0] and line["odd"].startswith("<object")
    assert line["unencodable"] == ["best_value", "config.optim.lr", "curve[0]", "odd"]
    assert records.find_record(tmp_path, "r")["status"] == "error"


def _short_writes(monkeypatch: pytest.MonkeyPatch, fail_after: int | None) -> None:
    """``os.write`` writes at most 100 bytes a call and, after ``fail_after`` calls, fails
    with ENOSPC: a nearly full disk."""
    import errno

    real, calls = os.write, [0]

    def write(fd: int, data: bytes) -> int:
        calls[0] += 1
        if fail_after is not None and calls[0] > fail_after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, bytes(data[:100]))

    monkeypatch.setattr(os, "write", write)


def test_a_record_that_does_not_fit_leaves_the_file_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.results.whole import NotAppended

    records.append_record(tmp_path, {"run_id": "old", "status": "ok"})
    before = records.runs_path(tmp_path).read_bytes()
    _short_writes(monkeypatch, fail_after=3)  # 300 of the line's bytes, then a full disk
    with pytest.raises(NotAppended, match="not appended"):
        records.append_record(tmp_path, {"run_id": "big", "status": "ok", "pad": "x" * 4000})
    assert records.runs_path(tmp_path).read_bytes() == before


def test_short_writes_still_append_the_whole_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records.append_record(tmp_path, {"run_id": "old", "status": "ok"})
    _short_writes(monkeypatch, fail_after=None)
    records.append_record(tmp_path, {"run_id": "big", "status": "ok", "pad": "x" * 4000})
    monkeypatch.undo()
    assert [r["run_id"] for r in records.load_records(tmp_path)] == ["old", "big"]


@contextlib.contextmanager
def _tmpfs(where: Path, size: str):
    """A small tmpfs at ``where`` (root only), always unmounted."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root to mount a tmpfs")
    where.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True, text=True,
    )  # fmt: skip
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {p.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` up to ``leave`` free bytes."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    with open(disk / "filler", "wb") as f:
        f.write(bytes(max(0, free - leave)))


def test_writers_on_a_full_disk_fail_cleanly_and_leave_no_temporary_file(
    tmp_path: Path,
) -> None:
    import errno

    import torch

    from bench.results import whole
    from bench.results.whole import NotAppended
    from bench.train.checkpoint import _atomic_save

    with _tmpfs(tmp_path / "disk", "256k") as disk:
        records.append_record(disk, {"run_id": "old", "status": "ok"})
        before = records.runs_path(disk).read_bytes()
        _fill(disk, leave=8192)
        with pytest.raises(OSError) as e:
            _atomic_save({"w": torch.zeros(50_000)}, disk / "common.pt")
        assert e.value.errno == errno.ENOSPC
        (disk / "dawnbench").mkdir()
        with pytest.raises(OSError) as e:
            whole.write(disk / "dawnbench" / "r.tsv", "x" * 50_000)
        assert e.value.filename == str(disk / "dawnbench" / "r.tsv")  # the file meant
        with pytest.raises(OSError):
            records.write_curve(disk, "r", [{"epoch": i, "pad": "x" * 100} for i in range(999)])
        with pytest.raises(NotAppended):
            records.append_record(disk, {"run_id": "r", "status": "ok", "pad": "x" * 50_000})
        assert records.runs_path(disk).read_bytes() == before
        left = [p.name for p in disk.rglob("*") if p.is_file() and p.name.endswith(".tmp")]
        assert left == [] and not (disk / "common.pt").exists()


def test_the_room_held_for_a_record_is_freed_and_a_dead_launchers_is_removed(
    tmp_path: Path,
) -> None:
    from bench.results import reserve

    stale = tmp_path / f"{reserve.PREFIX}old-run-{2**22 + 12345}"  # above any pid in use
    stale.write_bytes(b"x")
    room = reserve.hold(tmp_path, "run")
    assert room.path is not None and room.path.stat().st_size == reserve.ROOM
    assert not stale.exists()
    room.release()
    room.release()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_full_disk_ends_the_run_with_one_error_record_and_its_last_checkpoint(
    tmp_path: Path,
) -> None:
    """keep_checkpoints=1: epoch 1's checkpoint fits, epoch 2's (the two held at once)
    does not."""
    args = [o for o in TINY if not o.startswith("train.max_steps_per_epoch")]
    args += ["train.max_steps_per_epoch=2", "train.epochs=3", "train.keep_checkpoints=1"]
    with _tmpfs(tmp_path / "disk", "512k") as disk:
        records.append_record(disk, {"run_id": "earlier", "status": "ok"})
        before = records.runs_path(disk).read_bytes()
        p = run_cli("train", f"results.dir={disk}", *args, f"hydra.run.dir={tmp_path / 'hydra'}")
        out = p.stdout + p.stderr
        assert p.returncode != 0, out[-3000:]
        text = records.runs_path(disk).read_bytes()
        assert text.startswith(before)
        recs = records.load_records(disk)
        assert [r["run_id"] for r in recs][0] == "earlier" and len(recs) == 2, out[-3000:]
        rec = recs[1]
        assert rec["status"] == "error" and "no space left" in rec["reason"], rec["reason"]
        assert rec["checkpoint"] and rec["checkpoint"].endswith("epoch-0001"), out[-3000:]
        assert ck.latest(disk, rec["run_id"])["epoch"] == 1
        left = [str(q) for q in disk.rglob("*") if q.name.endswith(".tmp") or ".room-" in q.name]
        assert left == [], left
        # the failed save's shards are gone too (epoch 2 had no manifest): the disk is free
        kept = sorted(q.name for q in ck.run_dir(disk, rec["run_id"]).glob("epoch-*"))
        assert kept == ["epoch-0001", "epoch-0001.json"], kept
        assert "Traceback" not in p.stderr, p.stderr[-3000:]
        assert "resume=" in p.stderr


def _damaged_folder(root: Path, all_bad_class: bool = False) -> Path:
    """3 classes x 4 JPEGs per split, plus in train: a text file named ``notes.JPEG`` and
    a truncated JPEG (or, ``all_bad_class``, text files but one)."""
    from tests.conftest import make_jpeg_folder

    make_jpeg_folder(root, classes=3, per_class=4, size=24)
    if all_bad_class:  # one good training image: at least two batches of 4 are all damaged
        for f in sorted((root / "train").glob("*/*.jpg"))[1:]:
            f.write_text("not an image")
        return root
    (root / "train" / "c0" / "notes.JPEG").write_text("shopping list")
    good = (root / "train" / "c1" / "0.jpg").read_bytes()
    (root / "train" / "c1" / "cut.jpg").write_bytes(good[: len(good) // 2])
    return root


def _folder_data(root: Path, batch: int, strict: bool = False, cache: str = "none"):
    import torch

    from bench.data import build_data, validate
    from bench.data.config import CacheConfig, DataConfig

    cfg = DataConfig(
        name="imagefolder", root=str(root), batch_size=batch, eval_batch_size=4,
        image_size=16, eval_image_size=16, num_classes=0, loader="torch", num_workers=0,
        strict=strict,
    )  # fmt: skip
    c = CacheConfig(name=cache, dir=str(root.parent / "cache"), disk_gb=1.0, memory_gb=1.0)
    validate(cfg, c, 1)
    return build_data(cfg, c, 0, 1, torch.device("cpu"), 0)


def test_the_default_folder_loader_skips_and_counts_damaged_images(tmp_path: Path) -> None:
    b = _folder_data(_damaged_folder(tmp_path / "imgs"), batch=7)  # 14 files: 2 batches
    b.train.set_epoch(0)
    with pytest.warns(UserWarning, match="skipping corrupt image") as seen:
        batches = list(b.train)
    assert [len(y) for _, y in batches] == [7, 7]  # full batches: no epoch ends early
    assert b.train.epoch_stats()["data/corrupt"] == 2
    named = " ".join(str(w.message) for w in seen)
    assert "notes.JPEG" in named and "cut.jpg" in named
    assert sum(len(y) for _, y in b.eval) == 12


@pytest.mark.parametrize("cache", ["none", "memory"])
def test_a_batch_of_damaged_images_only_keeps_the_epoch_whole(tmp_path: Path, cache: str) -> None:
    root = _damaged_folder(tmp_path / "imgs", all_bad_class=True)
    b = _folder_data(root, batch=4, cache=cache)
    b.train.set_epoch(0)
    with pytest.warns(UserWarning):
        batches = list(b.train)
    assert len(batches) == len(b.train) == 3 and all(len(y) == 4 for _, y in batches)
    assert b.train.epoch_stats()["data/corrupt"] == 11
    assert all(int(v) == 0 for _, y in batches for v in y)  # the one good image, c0's


def test_the_default_folder_loader_stops_at_a_damaged_image_when_strict(tmp_path: Path) -> None:
    from bench.data.jpegs import CorruptImage

    b = _folder_data(_damaged_folder(tmp_path / "imgs"), batch=7, strict=True)
    b.train.set_epoch(0)
    with pytest.raises(CorruptImage, match=r"data.strict=true.*(notes\.JPEG|cut\.jpg)"):
        list(b.train)


@pytest.mark.slow
def test_runs_on_a_damaged_folder_count_the_skipped_images_or_stop_in_one_line(
    tmp_path: Path,
) -> None:
    root = _damaged_folder(tmp_path / "imgs")
    args = ["data=imagefolder", f"data.root={root}", "data.loader=torch", "cache=none"]
    args += ["data.image_size=16", "data.eval_image_size=16", "data.batch_size=14"]
    args += ["data.num_workers=0", "model.width=4", "train.epochs=1", "train.progress=false"]
    args += ["results.plot=false"]
    ok = run_cli("train", f"results.dir={tmp_path / 'lax'}", *args)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    (rec,) = records.load_records(tmp_path / "lax")
    assert rec["images_skipped"] == 2 and rec["status"] != "error", rec
    stop = run_cli("train", f"results.dir={tmp_path / 'strict'}", *args, "data.strict=true")
    assert stop.returncode != 0
    assert "Traceback" not in stop.stderr, stop.stderr[-3000:]
    lines = [ln for ln in stop.stderr.splitlines() if "data.strict=true" in ln]
    assert lines and ("notes.JPEG" in lines[0] or "cut.jpg" in lines[0]), stop.stderr[-3000:]
    (rec,) = records.load_records(tmp_path / "strict")
    assert rec["status"] == "error" and "CorruptImage" in rec["reason"], rec["reason"]


def _fake_checkpoint(results: Path, run_id: str, epoch: int, files: bool = True) -> Path:
    """A checkpoint as bench.train.checkpoint.save lays it out (2 ranks), small shards."""
    import json

    import torch

    from bench.train.checkpoint import shard_sizes

    d = ck.run_dir(results, run_id) / f"epoch-{epoch:04d}"
    d.mkdir(parents=True)
    for name in ("common.pt", "rank0.pt", "rank1.pt"):
        torch.save({"w": torch.arange(1000) * epoch}, d / name)
    m = {"run": {"run_id": run_id}, "config": {}, "epoch": epoch, "step": 2 * epoch}
    m |= {"world_size": 2, "train_time_s": 1.0, "curve": [], "status": "target_missed"}
    if files:
        m["files"] = shard_sizes(d)
    d.with_suffix(".json").write_text(json.dumps(m))
    return d


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


@pytest.mark.parametrize(
    "damage", ["manifest", "common.pt", "rank1.pt without recorded sizes", "rank0.pt missing"]
)
def test_a_damaged_newest_checkpoint_falls_back_to_the_intact_one(
    tmp_path: Path, damage: str
) -> None:
    _fake_checkpoint(tmp_path, "r", 1)
    new = _fake_checkpoint(tmp_path, "r", 2, files="without" not in damage)
    if damage == "manifest":
        _truncate(new.with_suffix(".json"))
    elif damage == "rank0.pt missing":
        (new / "rank0.pt").unlink()
    else:
        _truncate(new / damage.split()[0])
    with pytest.warns(UserWarning, match=r"damaged checkpoint skipped: .*epoch-0002"):
        m = ck.latest(tmp_path, "r")
    assert m is not None and m["epoch"] == 1 and m["path"].endswith("epoch-0001")
    skipped: list[str] = []
    assert ck.latest(tmp_path, "r", skipped)["epoch"] == 1 and len(skipped) == 1


def test_a_resume_with_no_intact_checkpoint_is_refused_in_one_line(tmp_path: Path) -> None:
    _truncate(_fake_checkpoint(tmp_path, "r", 1) / "common.pt")
    _truncate(_fake_checkpoint(tmp_path, "r", 2).with_suffix(".json"))
    p = run_cli("train", "resume=r", f"results.dir={tmp_path}", timeout=120)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "no intact checkpoint" in err[0], p.stderr
    assert "epoch-0001" in err[0] and "epoch-0002" in err[0]


@pytest.mark.usefixtures("one_process_world")
def test_a_saved_checkpoint_records_its_shard_sizes_and_verifies(tmp_path: Path) -> None:
    from bench.train.loop import checkpoints
    from tests.test_checkpoint import _state

    s = _state(tmp_path, "foreach")
    for epoch in (1, 2):
        s.epoch = epoch
        checkpoints(s).save(barrier=lambda: None)
    m = ck.latest(tmp_path, "r1")
    assert m["epoch"] == 2 and set(m["files"]) == {"common.pt", "rank0.pt"}
    common = Path(m["path"]) / "common.pt"
    common.write_bytes(common.read_bytes() + b"\0")  # the right archive, the wrong size
    with pytest.warns(UserWarning, match=r"epoch-0002: common.pt has \d+ bytes"):
        assert ck.latest(tmp_path, "r1")["epoch"] == 1


def test_a_negative_step_limit_is_refused(tmp_path: Path) -> None:
    from bench.launch.run import validate
    from bench.registry import ConfigError

    with pytest.raises(ConfigError, match="train.max_steps_per_epoch must be >= 0"):
        validate(_config(tmp_path, "train.max_steps_per_epoch=-5"))


def test_folder_splits_that_cannot_train_are_refused_before_launch(tmp_path: Path) -> None:
    from bench.data import validate
    from bench.data.config import CacheConfig, DataConfig
    from bench.registry import ConfigError
    from tests.conftest import make_jpeg_folder

    root = make_jpeg_folder(tmp_path / "imgs", classes=3, per_class=4)  # 12 training images
    cfg = DataConfig(name="imagefolder", root=str(root), batch_size=16, eval_batch_size=4)
    with pytest.raises(ConfigError, match="batch_size=16 is larger than the 12 training"):
        validate(cfg, CacheConfig(), 1)
    shutil.rmtree(root / "val" / "c2")
    cfg.batch_size = 4
    with pytest.raises(ConfigError, match=r"class folders differ: c2 \(only in train\)"):
        validate(cfg, CacheConfig(), 1)


def test_a_resume_may_name_the_results_folder_differently() -> None:
    saved = {"config": {"results": {"dir": "/data/results"}, "optim": {"lr": 0.1}}, "path": "p"}
    ck.check_compatible(saved, {"results": {"dir": "/data/results/"}, "optim": {"lr": 0.1}})
    ck.check_compatible(saved, {"results": {"dir": "/moved/results"}, "optim": {"lr": 0.1}})


def test_a_launch_leaves_no_temporary_run_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from bench.launch import run

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(run, "launch_workers", lambda cfg, run_json: 0)
    cfg = _config(tmp_path / "res", *TINY)
    meta = {"run_id": "r", "started_at": records.now_iso(), "launch_time": time.time()}
    run.launch_and_record(cfg, {**meta, "experiment": "t"}, None)
    assert list(temp.iterdir()) == []  # no bench-run-* folder left (resume= passes None)
    assert not list((tmp_path / "res").glob(".room-*"))


def test_the_divergence_rule_for_a_finite_loss() -> None:
    from bench.results.divergence import exploded

    assert exploded([2.3, 1.1, 0.7]) is None  # training
    assert exploded([2.3, 0.001, 1.5]) is None  # back up from near zero: not divergence
    assert exploded([float("nan")]) is None  # the NaN check's case
    assert "above" in exploded([4.5e22])  # lr=1e6: gone in the first epoch
    assert "lowest before (2)" in exploded([2.0, 2500.0])  # 1000 x 2 exceeded


@pytest.mark.slow
def test_a_run_whose_loss_explodes_is_recorded_diverged(tmp_path: Path) -> None:
    p = run_cli(
        "train", f"results.dir={tmp_path}", *TINY, "optim.lr=1e6", "train.epochs=2",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    )  # fmt: skip
    (rec,) = records.load_records(tmp_path)
    assert rec["status"] == "diverged", (rec["status"], p.stdout[-2000:])
    assert "training loss" in rec["reason"] and rec["diverged_at"]["epoch"] == 1


def test_a_read_only_runs_file_is_refused_before_work_starts(tmp_path: Path) -> None:
    from bench.launch.run import check_results_dir
    from bench.registry import ConfigError

    records.append_record(tmp_path, {"run_id": "old", "status": "ok"})
    runs = records.runs_path(tmp_path)
    if os.geteuid() == 0:  # root writes a mode-444 file: a read-only bind mount stops it
        subprocess.run(["mount", "--bind", str(runs), str(runs)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(runs)], check=True)
            with pytest.raises(ConfigError, match="runs.jsonl is not (a )?writable"):
                check_results_dir(str(tmp_path))
        finally:
            subprocess.run(["umount", str(runs)], check=False)
    else:
        runs.chmod(0o444)
        with pytest.raises(ConfigError, match="runs.jsonl is not (a )?writable"):
            check_results_dir(str(tmp_path))
    assert runs.read_text().startswith('{"run_id": "old"')


def test_figures_on_a_read_only_results_folder_fail_in_one_line(tmp_path: Path) -> None:
    from bench.config import Config, to_container

    cfg = Config()
    run = {"run_id": records.new_run_id(), "started_at": records.now_iso(), "launch_time": 0.0}
    rec = records.RunRecord.start(cfg, run, config=to_container(cfg), comm_sparse=False)
    rec.append(tmp_path)
    if os.geteuid() == 0:  # root writes anywhere: a read-only bind mount stops it
        subprocess.run(["mount", "--bind", str(tmp_path), str(tmp_path)], check=True)
        try:
            subprocess.run(["mount", "-o", "remount,ro,bind", str(tmp_path)], check=True)
            p = run_cli("figures", "--results-dir", str(tmp_path), timeout=300)
        finally:
            subprocess.run(["umount", str(tmp_path)], check=False)
    else:
        tmp_path.chmod(0o555)
        try:
            p = run_cli("figures", "--results-dir", str(tmp_path), timeout=300)
        finally:
            tmp_path.chmod(0o755)
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "not writable" in errors[0], p.stderr[-2000:]


def test_a_queue_launch_holds_room_for_a_record_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench.launch.run
    from bench.launch import runqueue

    cfg = _config(tmp_path / "res", *TINY)
    held = []

    def launch(c, queue_json):
        held.extend((tmp_path / "res").glob(".room-*"))
        return 1, "error", "the workers failed", None

    monkeypatch.setattr(bench.launch.run, "guarded_launch", launch)
    meta = {"run_id": "q1", "started_at": records.now_iso(), "launch_time": time.time()}
    results, stop = runqueue._launch("qid", [cfg], [meta], [""], tmp_path / "out")
    assert len(held) == 1 and not held[0].exists()  # held during the launch, then freed
    assert results[0][1]["status"] == "error" and not stop


def test_a_worker_ends_in_one_line_on_a_full_disk_a_damaged_image_or_a_peer_gone() -> None:
    import errno

    from bench.data.jpegs import CorruptImage
    from bench.train.__main__ import _one_line

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/r/common.pt")
    assert _one_line(full) == "no space left on device (/r/common.pt)"
    assert _one_line(CorruptImage("a/b.jpg: cannot decode")) == "a/b.jpg: cannot decode"
    gloo = RuntimeError("[pair.cc:561] Connection closed by peer [127.0.0.1]:1")
    assert _one_line(gloo) == "Connection closed by peer"
    assert _one_line(ValueError("a bug")) is None  # anything else keeps its traceback


@pytest.mark.usefixtures("one_process_world")
def test_a_save_removes_the_shards_of_a_failed_one(tmp_path: Path) -> None:
    from bench.train.loop import checkpoints
    from tests.test_checkpoint import _state

    s = _state(tmp_path, "foreach")
    s.epoch = 1
    checkpoints(s).save(barrier=lambda: None)
    stray = ck.run_dir(tmp_path, "r1") / "epoch-0002"  # shards written, no manifest
    stray.mkdir()
    (stray / "rank0.pt").write_bytes(b"x" * 1000)
    s.epoch = 3
    checkpoints(s).save(barrier=lambda: None)
    assert not stray.exists() and ck.latest(tmp_path, "r1")["epoch"] == 3


def test_a_batch_larger_than_an_array_data_set_is_refused(tmp_path: Path) -> None:
    from bench.data import validate
    from bench.data.config import CacheConfig, DataConfig
    from bench.registry import ConfigError

    validate(DataConfig(name="digits", batch_size=1436), CacheConfig(), 2)  # 1437 fit
    with pytest.raises(ConfigError, match=r"batch_size=2048 is larger than the digits.*1437"):
        validate(DataConfig(name="digits", batch_size=2048), CacheConfig(), 2)
    with pytest.raises(ConfigError, match="test_fraction"):
        validate(DataConfig(name="digits", test_fraction=1.5), CacheConfig(), 1)
