"""Run queues: several runs in one launch of the workers, each still its own run.

Identical configs in one queue train to the same curve (nothing of a finished run leaks
into the next); each run has its own record, curve and files; the warm-up run stays out
of the results; a worker killed during the second of three runs leaves that run an
error record and the third one runs in a new launch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.launch.runqueue import _sessions
from bench.results import records
from tests.conftest import REPO, TINY

LOCAL2 = ["cluster=local", "cluster.nnodes=1", "cluster.nproc_per_node=2"]


def _script(results: Path, out: Path, jobs: list[list[str]]) -> str:
    return textwrap.dedent(
        f"""
        from bench.sweeps.common import compose_all
        from bench.launch.runqueue import run_queue
        jobs = {jobs!r}
        res = run_queue(compose_all(jobs), experiment="dawnbench_digits",
                        output_dir={str(out)!r}, labels=[str(i) for i in range(len(jobs))])
        print("STATUSES", [rc for rc, _ in res])
        """
    )


def _start(tmp_path: Path, jobs: list[list[str]]) -> subprocess.Popen:
    src = _script(tmp_path / "res", tmp_path / "out", jobs)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, "-c", src], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _job(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "experiment=dawnbench_digits", *LOCAL2, *TINY, f"results.dir={tmp_path / 'res'}",
        "results.sweep_id=q", "train.stop_at_target=false", *extra,
    ]  # fmt: skip


def test_sessions_group_consecutive_equal_clusters() -> None:
    assert _sessions(["a", "a", "b", "a", "a"]) == [[0, 1], [2], [3, 4]]
    assert _sessions([]) == []


def test_identical_runs_in_one_launch_train_alike_and_record_apart(tmp_path: Path) -> None:
    same = _job(tmp_path, "train.epochs=1", "train.seed=3")
    other = _job(tmp_path, "train.epochs=1", "train.seed=4")
    proc = _start(tmp_path, [same, same, other])
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0 and "STATUSES [0, 0, 0]" in out, out[-3000:]
    assert out.count("run(s) in one launch of the workers") == 1  # one launch for all three
    recs = records.load_records(tmp_path / "res")
    assert len(recs) == 3 and len({r["run_id"] for r in recs}) == 3
    assert all(r["status"] == "target_missed" and r["epochs_run"] == 1 for r in recs)
    assert [r["queue"]["label"] for r in recs] == ["0", "1", "2"]
    assert {r["queue"]["id"] for r in recs} == {recs[0]["queue"]["id"]}
    curves = [pd.read_csv(r["curve"]) for r in recs]
    cols = ["loss/train", "acc/top1", "loss/eval"]
    # the same seed in the same worker processes, one after the other: the same training
    pd.testing.assert_frame_equal(curves[0][cols], curves[1][cols])
    assert not curves[2][cols].equals(curves[0][cols])  # another seed: another curve
    for r in recs:  # each run its own files
        assert Path(r["mllog"]).exists() and Path(r["dawnbench_tsv"]).exists()
    # the warm-up ran first, recorded apart
    (warm,) = records.load_records(tmp_path / "out" / "warmup")
    assert warm["queue"]["index"] == 0 and warm["queue"]["label"] == "warm-up"
    assert warm["config"]["results"]["sweep_id"] == ""


@pytest.mark.slow
def test_a_worker_killed_mid_queue_fails_that_run_only(tmp_path: Path) -> None:
    long = _job(tmp_path, "train.epochs=200", "train.max_steps_per_epoch=5")
    short = _job(tmp_path, "train.epochs=1")
    proc = _start(tmp_path, [short, long, short])
    lines = []
    for line in proc.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if "run 3 of 4" in line:  # the warm-up is run 1: the long run has started
            break
    time.sleep(2.0)
    pids = subprocess.run(["pgrep", "-f", f"bench.train --config {tmp_path}"],
                          capture_output=True, text=True).stdout.split()  # fmt: skip
    assert pids, "".join(lines)[-3000:]
    os.kill(int(pids[-1]), signal.SIGKILL)
    out, _ = proc.communicate(timeout=600)
    out = "".join(lines) + out
    assert "STATUSES [0, 1, 0]" in out, out[-4000:]
    assert out.count("run(s) in one launch of the workers") == 2  # the third: a new launch
    recs = records.load_records(tmp_path / "res")
    by_label = sorted(recs, key=lambda r: r["queue"]["label"])
    assert [r["status"] for r in by_label] == ["target_missed", "error", "target_missed"]
    failed = next(r for r in recs if r["status"] == "error")
    assert failed["queue"]["label"] == "1" and "exited with code -9" in failed["reason"]
