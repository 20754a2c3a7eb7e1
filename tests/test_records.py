"""Records are appended atomically and never rewritten; curves are never replaced."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

from bench.results import records


def _writer(d: str, i: int) -> None:
    for j in range(20):
        records.append_record(d, {"run_id": f"r{i}-{j}", "status": "ok", "pad": "x" * 5000})


def test_concurrent_appends_keep_every_record(tmp_path: Path) -> None:
    records.append_record(tmp_path, {"run_id": "old", "status": "ok"})
    ctx = mp.get_context("spawn")
    ps = [ctx.Process(target=_writer, args=(str(tmp_path), i)) for i in range(3)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
    recs = records.load_records(tmp_path)
    ids = [r["run_id"] for r in recs]
    assert ids[0] == "old"
    assert len(ids) == 61 and len(set(ids)) == 61


def test_bad_status_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        records.append_record(tmp_path, {"run_id": "x", "status": "great"})


def test_curve_is_never_replaced(tmp_path: Path) -> None:
    records.write_curve(tmp_path, "run1", [{"epoch": 1, "top1": 0.5}])
    with pytest.raises(FileExistsError):
        records.write_curve(tmp_path, "run1", [{"epoch": 1, "top1": 0.9}])
    assert records.load_curve(tmp_path, "run1")["top1"].tolist() == [0.5]
    assert not list((tmp_path / "curves").glob(".*tmp"))
