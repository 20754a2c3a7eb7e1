"""Fault tolerance of real 2-worker runs: elastic restart after a killed worker, SIGTERM
then resume by hand (same curve as an uninterrupted run, residuals included), a peer that
never joins, an injected NaN.  The multi-process kill/restart/resume tests are slow."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bench.results import records
from tests.conftest import REPO, TINY, run_cli

# small enough to be quick, long enough (20 steps an epoch) to be killed mid-epoch
LONG = [o for o in TINY if not o.startswith("train.max_steps_per_epoch")]
LONG += ["train.max_steps_per_epoch=20", "train.target_metric=top5", "train.target_value=0.01"]
LONG += ["train.stop_at_target=false"]
SPARSE = ["comm=mstopk", "comm.density=0.1", "comm.min_numel=0"]


def _start(results: Path, *args: str, session: bool = False) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HYDRA_FULL_ERROR="0")
    cmd = [sys.executable, "-m", "reproduce", "train", f"results.dir={results}", *LONG, *args]
    cmd.append(f"hydra.run.dir={results / 'hydra'}")
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=session,  # its own process group, as a terminal's foreground job
    )  # fmt: skip


def _workers(results: Path) -> list[int]:
    """Pids of this run's training workers (their command line names its run JSON)."""
    out = subprocess.run(
        ["pgrep", "-f", f"bench.train --config {results}"], capture_output=True, text=True
    )
    return sorted(int(p) for p in out.stdout.split())


def _wait_checkpoint(results: Path, epoch: int, proc: subprocess.Popen, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not list((results / "checkpoints").glob(f"*/epoch-{epoch:04d}.json")):
        assert proc.poll() is None, proc.stdout.read()[-3000:]  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.2)


def _finish(proc: subprocess.Popen, limit: float = 600) -> str:
    out, _ = proc.communicate(timeout=limit)
    return out


@pytest.mark.slow
def test_a_killed_worker_restarts_the_group_from_the_last_checkpoint(tmp_path: Path) -> None:
    proc = _start(tmp_path, "train.epochs=3", "cluster.max_restarts=1")
    _wait_checkpoint(tmp_path, 1, proc, 300)
    time.sleep(1.0)  # into epoch 2
    victim = _workers(tmp_path)[-1]
    os.kill(victim, signal.SIGKILL)
    out = _finish(proc)
    assert proc.returncode == 0, out[-4000:]
    (rec,) = records.load_records(tmp_path)
    assert rec["status"] == "ok" and rec["epochs_run"] == 3, out[-3000:]
    (r,) = rec["restarts"]
    assert r["exit_code"] == -signal.SIGKILL and r["epoch_resumed_from"] in (1, 2)
    assert r["failed_rank"] in (0, 1) and r["time"] > 0
    curve = pd.read_csv(rec["curve"])
    assert list(curve["epoch"]) == [1, 2, 3]  # no gap, no duplicate
    assert curve["clock/train_s"].is_monotonic_increasing
    assert rec["wall_time_s"] > rec["train_time_s"] and rec["checkpoint"]
    assert not _workers(tmp_path)


@pytest.mark.slow
def test_sigterm_then_resume_continues_like_an_uninterrupted_run(tmp_path: Path) -> None:
    """mstopk with error feedback: the resumed run equals the uninterrupted one epoch by
    epoch (same losses to rounding), so the residuals, RNG and schedule came back."""
    ref = _start(tmp_path / "ref", "train.epochs=3", *SPARSE)
    out = _finish(ref)
    assert ref.returncode == 0, out[-3000:]
    (want,) = records.load_records(tmp_path / "ref")
    res = tmp_path / "cut"
    proc = _start(res, "train.epochs=3", *SPARSE)
    _wait_checkpoint(res, 1, proc, 300)
    time.sleep(1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc, 60)
    assert time.monotonic() - t0 < 30 and not _workers(res)  # stopped within seconds
    assert "resume=" in out, out[-3000:]
    (stopped,) = records.load_records(res)
    assert stopped["status"] == "interrupted" and stopped["checkpoint"], stopped
    p = run_cli("train", f"resume={stopped['run_id']}", f"results.dir={res}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (final,) = records.load_records(res)  # one record: the latest attempt
    assert final["run_id"] == stopped["run_id"] and final["attempt"] == 2
    assert final["status"] == "ok" and final["epochs_run"] == 3
    curve, ref_curve = pd.read_csv(final["curve"]), pd.read_csv(want["curve"])
    assert list(curve["epoch"]) == [1, 2, 3]
    cols = ["loss/train", "acc/train_top1", "acc/top1", "loss/eval"]
    pd.testing.assert_frame_equal(curve[cols], ref_curve[cols], check_exact=False, rtol=1e-5)
    assert final["train_time_s"] >= float(curve["clock/train_s"].iloc[-1]) - 1e-9
    assert final["wall_time_s"] > stopped["wall_time_s"]


@pytest.mark.slow
def test_ctrl_c_stops_every_process_and_records_the_interrupted_run(tmp_path: Path) -> None:
    """Ctrl-C in a terminal: SIGINT to the launcher and its workers at once."""
    proc = _start(tmp_path, "train.epochs=3", session=True)
    _wait_checkpoint(tmp_path, 1, proc, 300)
    time.sleep(0.5)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out = _finish(proc, 120)
    assert time.monotonic() - t0 < 30 and not _workers(tmp_path), out[-3000:]
    (rec,) = records.load_records(tmp_path)
    assert rec["status"] == "interrupted" and "SIGINT" in rec["reason"], rec
    assert rec["checkpoint"].endswith(("epoch-0001", "epoch-0002")) and rec["epochs_run"] >= 1
    assert f"resume={rec['run_id']}" in out


@pytest.mark.slow
def test_a_peer_that_never_joins_ends_with_a_timeout(tmp_path: Path) -> None:
    """Node 0 of a 2-node job alone: the rendezvous gives up after cluster.rdzv_timeout_s,
    and the run's record says why."""
    from bench.cluster.torchrun import free_port

    t0 = time.monotonic()
    p = run_cli(
        "train",
        f"results.dir={tmp_path}",
        "cluster=multinode",
        "cluster.nnodes=2",
        "cluster.node_rank=0",
        f"cluster.rdzv_endpoint=127.0.0.1:{free_port()}",
        "cluster.rdzv_timeout_s=15",
        *TINY,
        timeout=300,
    )
    took = time.monotonic() - t0
    assert p.returncode != 0 and took < 15 + 90, took
    (rec,) = records.load_records(tmp_path)
    assert rec["status"] == "error" and "RendezvousTimeoutError" in rec["reason"], rec
    assert "rdzv_timeout_s" in rec["reason"] and rec["wall_time_s"] < 15 + 90


@pytest.mark.slow
def test_a_hung_peer_ends_the_run_within_the_collective_timeout(tmp_path: Path) -> None:
    """One worker stopped (SIGSTOP) mid-epoch: the other's collective gives up after
    comm.timeout_s, the run ends with an error record saying so, no process left."""
    proc = _start(tmp_path, "train.epochs=3", "comm.timeout_s=10")
    _wait_checkpoint(tmp_path, 1, proc, 300)
    victim = _workers(tmp_path)[-1]
    os.kill(victim, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        out = _finish(proc, 300)
    finally:
        if victim in _workers(tmp_path):
            os.kill(victim, signal.SIGKILL)
    assert proc.returncode != 0 and time.monotonic() - t0 < 10 + 120, out[-3000:]
    (rec,) = records.load_records(tmp_path)
    assert rec["status"] == "error" and "Timed out waiting 10000ms" in rec["reason"], rec
    assert rec["epochs_run"] >= 1 and rec["checkpoint"]  # what was done stays on record


def test_an_injected_nan_stops_the_run_as_diverged(tmp_path: Path) -> None:
    env_before = os.environ.get("BENCH_FAULT_NAN_STEP")
    os.environ["BENCH_FAULT_NAN_STEP"] = "3"  # rank 0's loss at step 3 (epoch 2)
    try:
        p = run_cli("train", f"results.dir={tmp_path}", "train.epochs=3", *TINY)
    finally:
        if env_before is None:
            os.environ.pop("BENCH_FAULT_NAN_STEP")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (rec,) = records.load_records(tmp_path)
    assert rec["status"] == "diverged", rec
    assert rec["diverged_at"]["step"] == 3 and rec["diverged_at"]["epoch"] == 2
    assert rec["diverged_at"]["where"].startswith("loss (then gradient bucket")
    assert "step 3" in rec["reason"] and rec["epochs_run"] == 2
    # the NaN never reached the model: the last checkpoint is epoch 1's, finite
    assert rec["checkpoint"].endswith("epoch-0001")
    curve = pd.read_csv(rec["curve"])
    assert curve["data/steps"].tolist() == [2, 0]
    assert json.loads((Path(rec["checkpoint"] + ".json")).read_text())["epoch"] == 1


HAVE_ROOT = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)")
def test_emulated_hitopk_with_a_killed_worker_finishes_with_its_restart(tmp_path: Path) -> None:
    """2 emulated nodes x 2 workers, hitopk; one worker killed mid-run: both nodes' agents
    restart their groups from the last checkpoint, the run ends ok, the restart recorded."""
    args = ["cluster=emulated", "cluster.link_check=false", "cluster.max_restarts=1"]
    args += ["comm=hitopk", "comm.density=0.1", "comm.min_numel=0", "train.epochs=3"]
    proc = _start(tmp_path, *args)
    _wait_checkpoint(tmp_path, 1, proc, 400)
    time.sleep(1.0)
    os.kill(_workers(tmp_path)[-1], signal.SIGKILL)
    out = _finish(proc)
    assert proc.returncode == 0, out[-4000:]
    (rec,) = records.load_records(tmp_path)
    assert rec["status"] == "ok" and rec["world_size"] == 4 and rec["nnodes"] == 2, out[-3000:]
    assert len(rec["restarts"]) == 1 and rec["restarts"][0]["epoch_resumed_from"] in (1, 2)
    assert list(pd.read_csv(rec["curve"])["epoch"]) == [1, 2, 3]
    assert not _workers(tmp_path)
