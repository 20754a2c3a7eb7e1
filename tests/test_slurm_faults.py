"""Preemption and failures as a real Slurm cluster makes them, against a one-job sweep
submitted with ``--launcher slurm`` to a local cluster (``bench/cluster/slurm.py``): a
requeued job resumes its run (recorded once), a cancelled one is recorded ``interrupted``
and the sweep submits it again, a node set DOWN under its job loses nothing, a job at its
time limit is recorded ``interrupted`` with a checkpoint to resume from.  Each asserts what
the record and ``ablation --status`` say.  Needs root, slurm-wlm and munge; slow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY
from tests.test_slurm import _cluster, leaves_nothing

pytestmark = [pytest.mark.slow, pytest.mark.root]


STARTED: list[subprocess.Popen] = []  # the sweep commands a test started


@pytest.fixture
def nothing_left_behind():
    """No daemon, namespace, mount or folder of the test's clusters left behind, and no
    sweep command of the test still polling a cluster that is gone."""
    try:
        yield from leaves_nothing()
    finally:
        while STARTED:
            p = STARTED.pop()
            if p.poll() is None:
                p.kill()
                p.communicate()


SWEEP = "faults"
SHOW = ("JobState", "Reason", "NodeList", "BatchHost", "Restarts", "BeginTime", "ExitCode")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "BOOT_FAIL")


def _cmd(results: Path, *extra: str) -> list[str]:
    """A one-job grid sweep on one Slurm node: digits, dense, many short epochs with a
    checkpoint after each (a fault lands mid-run, after the first checkpoint)."""
    return [sys.executable, "-m", "reproduce", "ablation", "--grid", "--comm", "dense",
            "--cache", "none", "--update", "naive", "--seeds", "1", "--cluster", "local",
            "--launcher", "slurm", "--sweep-id", SWEEP, "--results-dir", str(results),
            "hydra.launcher.partition=cpu", "cluster.nproc_per_node=1", "train.epochs=40",
            "train.checkpoint_every=1", "train.stop_at_target=false", *TINY,
            *extra]  # fmt: skip


# each epoch held this long after its checkpoint (bench/train/loop.py): a run of 40 tiny
# epochs lasts about a minute however fast this machine trains them (7 s unheld), so that
# a fault lands in the middle of it
HOLD_S = "1.5"


def _env(cluster) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**cluster.env(), "PYTHONUNBUFFERED": "1", "PYTHONPATH": path,
            "BENCH_FAULT_EPOCH_HOLD_S": HOLD_S}  # fmt: skip


def _start(cluster, results: Path, *extra: str) -> subprocess.Popen:
    p = subprocess.Popen(_cmd(results, *extra), cwd=REPO, env=_env(cluster), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    STARTED.append(p)
    return p


def _wait(what: str, ready, timeout: float = 240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = ready()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"no {what} after {timeout:.0f} s")


def _job_and_checkpoint(results: Path) -> str:
    """The sweep's Slurm job id, once its run has written its first checkpoint."""

    def ready() -> str | None:
        jobs = list((results / "hydra").rglob("slurm-jobs.jsonl"))
        ckpt = list((results / "checkpoints").glob("*/epoch-*.json"))
        if jobs and ckpt:
            return json.loads(jobs[0].read_text().splitlines()[-1])["job_id"]
        return None

    return _wait("Slurm job with a checkpoint", ready)


def _scontrol(cluster, *args: str) -> str:
    p = subprocess.run(["scontrol", *args], env=cluster.env(), capture_output=True, text=True,
                       timeout=60)  # fmt: skip
    assert p.returncode == 0, p.stderr
    return p.stdout


def _state(cluster, job: str) -> str:
    out = _scontrol(cluster, "show", "job", "--oneliner", job)
    return out.split("JobState=", 1)[1].split()[0]


def _finish(proc: subprocess.Popen, timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


def _attempts(results: Path) -> list[dict]:
    return [json.loads(x) for x in (results / "runs.jsonl").read_text().splitlines()]


def _status(cluster, results: Path) -> str:
    p = subprocess.run([sys.executable, "-m", "reproduce", "ablation", "--status", SWEEP,
                        "--results-dir", str(results)], cwd=REPO, env=_env(cluster),
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def _running(made: list, nodes: int, results: Path, *extra: str):
    """(cluster, the sweep command, its Slurm job) once the job's run has a checkpoint."""
    cluster = _cluster(made, nodes, cpus=2)
    proc = _start(cluster, results, *extra)
    return cluster, proc, _job_and_checkpoint(results)


def _line(status: str, job: str) -> str:
    return next(ln for ln in status.splitlines() if f"slurm job {job} " in ln)


def test_a_requeued_job_resumes_its_run_from_its_checkpoint_recorded_once(
    tmp_path: Path, nothing_left_behind
) -> None:
    cluster, proc, job = _running(nothing_left_behind, 1, tmp_path)
    _scontrol(cluster, "requeue", job)
    # Slurm holds a requeued job back two minutes (its begin time): start it now
    _wait("requeued job pending", lambda: _state(cluster, job) == "PENDING", 120)
    _scontrol(cluster, "update", f"jobid={job}", "StartTime=now")
    out = _finish(proc)
    assert proc.returncode == 0, out[-3000:]
    recs = _attempts(tmp_path)
    assert len({r["run_id"] for r in recs}) == 1, recs  # one run, two attempts
    first, last = recs[0], recs[-1]
    assert (first["status"], first["attempt"], first["slurm"]["restarts"]) == ("interrupted", 1, 0)
    assert last["status"] in ("ok", "target_missed") and last["attempt"] == 2, last
    assert last["slurm"] == {**first["slurm"], "restarts": 1} and last["epochs_run"] == 40
    status = _status(cluster, tmp_path)
    assert "grid: 1 of 1 recorded" in status, status
    line = _line(status, job)
    assert "COMPLETED, exit code 0, requeued 1x" in line and "(attempt 2) on node0" in line, line


def test_a_cancelled_job_is_recorded_interrupted_and_the_sweep_submits_it_again(
    tmp_path: Path, nothing_left_behind
) -> None:
    cluster, proc, job = _running(nothing_left_behind, 1, tmp_path)
    subprocess.run(["scancel", job], env=cluster.env(), check=True, timeout=60)
    out = _finish(proc)
    assert proc.returncode != 0 and f"job {job} failed" in out, out[-3000:]
    (rec,) = _attempts(tmp_path)
    assert rec["status"] == "interrupted" and "SIGTERM" in rec["reason"], rec
    assert rec["slurm"]["job_id"] == job and rec["checkpoint"], rec
    status = _status(cluster, tmp_path)
    assert "grid: 1 of 1 recorded (1 interrupted)" in status, status
    assert "CANCELLED" in _line(status, job) and "interrupted" in _line(status, job), status
    # the same command again (another plan is refused): only the interrupted job is
    # submitted, and it is recorded
    again = subprocess.run(_cmd(tmp_path), cwd=REPO, env=_env(cluster),
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    out = again.stdout + again.stderr
    assert "submitted 1 job(s)" in out, out[-3000:]
    status = _status(cluster, tmp_path)
    assert "grid: 1 of 1 recorded (1 ok)" in status or "1 target_missed" in status, status


def test_a_node_set_down_under_its_job_loses_nothing(tmp_path: Path, nothing_left_behind) -> None:
    cluster, proc, job = _running(nothing_left_behind, 2, tmp_path)
    node = _scontrol(cluster, "show", "job", "--oneliner", job).split(" NodeList=")[1].split()[0]
    _scontrol(cluster, "update", f"nodename={node}", "state=down", "reason=test-fault")

    # the job is requeued (a node failure) onto the other node, held back by a begin time:
    # let it start now, whenever it is seen pending, until it runs elsewhere or has ended
    seen: list[str] = []

    def moved_or_ended() -> bool:
        info = _scontrol(cluster, "show", "job", "--oneliner", job)
        seen[:] = [" ".join(w for w in info.split() if w.split("=")[0] in SHOW)]
        state = info.split("JobState=", 1)[1].split()[0]
        if state == "PENDING":
            _scontrol(cluster, "update", f"jobid={job}", "StartTime=now")
        on = info.split(" NodeList=")[1].split()[0] if " NodeList=" in info else ""
        return (state == "RUNNING" and on not in ("", node, "(null)")) or state in ENDED

    try:
        _wait("job running on another node or ended", moved_or_ended, 240)
    except AssertionError as e:
        raise AssertionError(f"{e}; last seen: {seen}") from None
    out = _finish(proc)
    recs = _attempts(tmp_path)
    first = recs[0]
    assert first["status"] in ("interrupted", "error") and first["reason"], first
    assert first["slurm"]["node"] == node
    status = _status(cluster, tmp_path)
    line = _line(status, job)
    if len(recs) > 1:  # requeued: resumed on the other node, the same run
        assert proc.returncode == 0, out[-3000:]
        assert {r["run_id"] for r in recs} == {first["run_id"]}
        assert recs[-1]["status"] in ("ok", "target_missed") and recs[-1]["attempt"] == 2
        assert recs[-1]["slurm"]["node"] != node and "requeued 1x" in line, line
    else:  # not requeued: the job failed with its reason; the sweep resumes it
        assert "NODE_FAIL" in line and "interrupted" in line, line
        assert "grid: 1 of 1 recorded (1 interrupted)" in status, status


def test_a_job_at_its_time_limit_is_recorded_interrupted_and_resumable(
    tmp_path: Path, nothing_left_behind
) -> None:
    # the warning 30 s before a 2-minute limit: a run on a loaded machine has checkpointed
    # by then (at 1 minute and 20 s it had not, and nothing was left to resume)
    limit = ("hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=30", "train.epochs=400")
    cluster, proc, job = _running(nothing_left_behind, 1, tmp_path, *limit)
    out = _finish(proc)
    assert proc.returncode != 0 or "interrupted" in out, out[-3000:]
    (rec,) = _attempts(tmp_path)
    assert rec["status"] == "interrupted", rec
    assert "SIGUSR2" in rec["reason"] or "SIGTERM" in rec["reason"], rec
    assert rec["checkpoint"] and Path(rec["checkpoint"]).exists(), rec  # resumable
    status = _status(cluster, tmp_path)
    assert "grid: 1 of 1 recorded (1 interrupted)" in status, status
    line = _line(status, job)
    # stopped at the warning, the run exits 130 before the limit (FAILED); or the limit
    # came first (TIMEOUT)
    ended = "TIMEOUT" in line or "COMPLETED" in line or "FAILED, exit code 130" in line
    assert ended and "interrupted" in line, line
