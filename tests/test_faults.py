"""Nothing lost under faults: a killed launcher, non-finite config numbers, short writes,
a full disk, damaged images and damaged checkpoints.  Each case ends with one line, whole
lines in ``runs.jsonl`` (earlier ones byte for byte), and no temporary file left."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from bench import checkpoint as ck
from bench.results import records
from tests.conftest import run_cli
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
