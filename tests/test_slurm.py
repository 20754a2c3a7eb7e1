"""The sweeps' Slurm path against a real Slurm cluster made on this machine
(``bench/cluster/slurm.py``, ``python -m reproduce cluster slurm-up``): the launcher fits
the partition (``sinfo`` output parsed without Slurm), a refused request is one line,
and (as root, with slurm-wlm and munge) a ``train -m`` of two jobs on a one-node cluster
whose refused job is seen ended with its exit code and log; every test leaves no daemon,
namespace or mount behind.  Slow: the protocol's ``--quick`` sweep on 2 nodes x 2."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cluster.netns import owner_alive
from bench.launch.submit import Partition, check_fit, parse_sinfo, resources
from bench.registry import ConfigError
from tests.conftest import REPO, TINY

SINFO = """\
node0|cpu*|2|3900|(null)
node1|cpu*|2|3900|(null)
g0|gpu|64|512000|gpu:a100:4(S:0-1)
g1|gpu|64|512000|gpu:a100:8(S:0-1)
"""


def test_sinfo_gives_each_partition_its_nodes_cpus_memory_and_gpus() -> None:
    cpu = parse_sinfo(SINFO, None)  # the default partition, marked *
    assert cpu == Partition("cpu", 2, 2, 3900, 0, "(null)")
    gpu = parse_sinfo(SINFO, "gpu")
    assert (gpu.nodes, gpu.cpus, gpu.mem_mb, gpu.gpus) == (2, 64, 512000, 8)
    assert parse_sinfo(SINFO, "nope") is None


@pytest.mark.parametrize(
    "params, message",
    [
        ({"nodes": 3}, "hydra.launcher.nodes=3 cannot be satisfied on partition cpu"),
        ({"nodes": 1, "gpus_per_node": 8}, "gpus_per_node=8 cannot be satisfied"),
        ({"cpus_per_task": 32}, "cpus_per_task=32 cannot be satisfied"),
        ({"cpus_per_task": 2, "tasks_per_node": 2}, "at most 2 CPUs for 2 task(s)"),
        ({"mem_gb": 256}, "mem_gb=256 cannot be satisfied"),
    ],
)
def test_a_request_no_node_can_satisfy_is_refused_naming_the_value(params, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_fit(params, parse_sinfo(SINFO, "cpu"))
    check_fit(
        {"nodes": 2, "gpus_per_node": None, "cpus_per_task": 2, "mem_gb": 3},
        parse_sinfo(SINFO, "cpu"),
    )
    check_fit({"nodes": 2, "gpus_per_node": 8}, parse_sinfo(SINFO, "gpu"))


def test_gpus_are_asked_only_where_the_job_trains_on_them() -> None:
    from bench.sweeps.common import compose_all

    cpu_run, gpu_run, auto_run = compose_all([
        ["cluster=multinode", "cluster.nnodes=2", "cluster.nproc_per_node=2", f"train.device={d}"]
        for d in ("cpu", "cuda", "auto")
    ])  # fmt: skip
    cpu, gpu = parse_sinfo(SINFO, "cpu"), parse_sinfo(SINFO, "gpu")
    assert resources("slurm", cpu_run, gpu) == [
        "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1",
        "hydra.launcher.cpus_per_task=2",
    ]  # fmt: skip
    assert "hydra.launcher.gpus_per_node=2" in resources("slurm", gpu_run, cpu)
    assert "hydra.launcher.gpus_per_node=2" in resources("slurm", auto_run, gpu)
    assert not any("gpus" in r for r in resources("slurm", auto_run, cpu))
    # what the user set is theirs
    mine = resources("slurm", gpu_run, gpu, given=["cpus_per_task", "gpus_per_node"])
    assert mine == ["hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1"]
    assert resources("submitit_local", gpu_run, gpu) == []


def test_a_record_made_in_a_slurm_job_names_the_job_and_its_nodes() -> None:
    from bench.results.records import expand_nodelist, slurm_job

    assert expand_nodelist("node[0-1]") == ["node0", "node1"]
    assert expand_nodelist("n[01-03,7],gpu5") == ["n01", "n02", "n03", "n7", "gpu5"]
    env = {"SLURM_JOB_ID": "45", "SLURM_ARRAY_JOB_ID": "44", "SLURM_ARRAY_TASK_ID": "1",
           "SLURM_JOB_NODELIST": "node[0-1]", "SLURMD_NODENAME": "node0",
           "SLURM_RESTART_COUNT": "1"}  # fmt: skip
    assert slurm_job(env) == {"job_id": "44_1", "nodes": ["node0", "node1"], "node": "node0",
                              "restarts": 1}  # fmt: skip
    assert slurm_job({"SLURM_JOB_ID": "7", "SLURM_NODELIST": "a"})["job_id"] == "7"
    assert slurm_job({}) is None  # outside Slurm


def test_status_gives_each_slurm_job_its_state_exit_code_run_and_nodes(tmp_path: Path) -> None:
    from bench.launch.submit import note_jobs, status_lines

    note_jobs(tmp_path / "tune", [("3_0", "comm=dense"), ("3_1", "comm=hitopk")])
    note_jobs(tmp_path / "eval", [("4_0", "comm=dense train.seed=0"), ("5", "")])
    recs = [
        {"run_id": "r1", "status": "ok", "attempt": 2,
         "slurm": {"job_id": "3_0", "nodes": ["node0", "node1"], "restarts": 1}},
        {"run_id": "r2", "status": "interrupted", "reason": "interrupted by SIGTERM",
         "slurm": {"job_id": "4_0", "nodes": ["node1"]}},
        {"run_id": "r3", "status": "ok"},  # not run in Slurm
    ]  # fmt: skip
    states = {
        "3_0": {"JobState": "COMPLETED", "ExitCode": "0:0", "Restarts": "1"},
        "3_1": {"JobState": "FAILED", "ExitCode": "2:0", "Reason": "NonZeroExitCode"},
        "4_0": {"JobState": "CANCELLED", "ExitCode": "0:15"},
        "5": {"JobState": "PENDING", "Reason": "Resources"},
    }
    lines = status_lines(tmp_path, recs, state=lambda j: states[j])
    assert sorted(lines) == [  # in order of submission (here: the same second)
        "slurm job 3_0 (comm=dense): COMPLETED, exit code 0, requeued 1x; run r1 ok "
        "(attempt 2) on node0,node1",
        "slurm job 3_1 (comm=hitopk): FAILED, exit code 2, reason NonZeroExitCode; no record",
        "slurm job 4_0 (comm=dense train.seed=0): CANCELLED, exit code 0, signal 15; run r2 "
        "interrupted (attempt 1) on node1: interrupted by SIGTERM",
        "slurm job 5: PENDING (Resources); no record",
    ]
    gone = status_lines(tmp_path / "tune", recs, state=lambda j: {})
    assert gone[1] == "slurm job 3_1 (comm=hitopk): gone from the controller; no record"


def test_a_requeued_job_with_its_first_result_is_not_seen_ended(tmp_path: Path, monkeypatch):
    from types import SimpleNamespace

    from bench.launch import submit

    pickle = tmp_path / "result.pkl"
    pickle.write_bytes(b"x")  # the first attempt's, left before the requeue
    job = SimpleNamespace(job_id="9_0", paths=SimpleNamespace(result_pickle=pickle),
                          exception=lambda: None)  # fmt: skip
    monkeypatch.setattr(submit, "slurm_state", lambda j: {"JobState": "PENDING"})
    assert submit._outcome(job, True) == (False, None)
    monkeypatch.setattr(submit, "slurm_state", lambda j: {"JobState": "COMPLETED"})
    assert submit._outcome(job, True) == (True, None)


# -- a real Slurm cluster on this machine --------------------------------------------------


def _why_not_real() -> str:
    from bench.cluster.slurm import PACKAGES, missing_tools

    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (network namespaces)"
    missing = missing_tools() + [t for t in ("ip", "tc") if shutil.which(t) is None]
    return f"a local Slurm cluster needs {', '.join(missing)} ({PACKAGES})" if missing else ""


def _ours() -> dict[str, set[str]]:
    """What a local Slurm cluster leaves on this machine: its daemons (by the conf in their
    environment), its namespaces and the mounts under /run/netns (``ip netns add``)."""
    daemons = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm = (d / "comm").read_text().strip()
            env = (d / "environ").read_bytes()
        except OSError:
            continue
        if comm in ("munged", "slurmctld", "slurmd", "slurmstepd") and b"tkb-slurm-" in env:
            daemons.add(f"{d.name}:{comm}")
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    mounts = Path("/proc/mounts").read_text()
    return {
        "daemons": daemons,
        "namespaces": {ln.split()[0] for ln in ns.splitlines() if ln.startswith("tkb-")},
        "mounts": {m for m in re.findall(r"/run/netns/(tkb-\S+)", mounts)},
        "folders": {str(p) for p in Path("/tmp").glob("tkb-slurm-*")},
    }


@pytest.fixture
def nothing_left_behind():
    """Asserts that a test's clusters left no daemon, namespace, mount or folder (those of
    other runs on this machine, there before, are not counted)."""
    yield from leaves_nothing()


def leaves_nothing():
    """:func:`nothing_left_behind`'s body (a generator other test files' fixtures share)."""
    if why := _why_not_real():
        pytest.skip(why)
    before = _ours()
    made: list = []
    yield made
    for c in made:
        c.down()
    deadline = time.monotonic() + 20
    while True:
        after = _ours()
        left = {k: after[k] - before[k] for k in after}
        # another run's namespaces, made meanwhile, belong to a live owner
        ids = {c.describe_id for c in made}
        for k in ("namespaces", "mounts"):
            left[k] = {
                n for n in left[k] if n.split("-")[1] in ids or not owner_alive(n.split("-")[1])
            }
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not any(left.values()), f"left behind: {left}"


def _cluster(made: list, nodes: int, cpus: int = 0):
    from bench.cluster.slurm import SlurmCluster

    c = SlurmCluster(nodes, 1e9, cpus=cpus)
    made.append(c)
    c.up()
    c.describe_id = c.net.run_id
    return c


def _reproduce(cluster, *args: str, timeout: float) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**cluster.env(), "PYTHONUNBUFFERED": "1", "HYDRA_FULL_ERROR": "0", "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-m", "reproduce", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.mark.root
def test_a_two_job_sweep_on_a_real_one_node_slurm_sees_both_jobs_end(
    tmp_path: Path, nothing_left_behind
) -> None:
    cluster = _cluster(nothing_left_behind, 1, cpus=2)
    t0 = time.monotonic()
    # dense trains; hitopk is refused in its job (exit 2, no result): seen ended all the same
    p = _reproduce(cluster, "train", "-m", "cluster=multinode", "hydra/launcher=slurm",
                   "hydra.launcher.partition=cpu", "hydra.launcher.nodes=1",
                   "hydra.launcher.cpus_per_task=1", "cluster.nnodes=1",
                   "cluster.nproc_per_node=1", "comm=dense,hitopk", "train.epochs=1", *TINY,
                   f"results.dir={tmp_path}", timeout=240)  # fmt: skip
    out = p.stdout + p.stderr
    assert time.monotonic() - t0 < 180, out
    assert "submitted 2 job(s) to Slurm" in out, out
    assert re.search(r"job \S+ failed \(.*comm=hitopk.*exit code 2", out), out
    assert "hitopk needs at least 2 nodes" in out  # the tail of its log
    assert re.search(r"job \S+ ended \(.*comm=dense", out), out
    assert p.returncode != 0  # one job failed
    import json

    recs = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["comm"] for r in recs] == ["dense"]
    assert recs[0]["slurm"]["nodes"] == ["node0"] and recs[0]["slurm"]["restarts"] == 0
    # a request the partition cannot satisfy: one line, nothing submitted
    p = _reproduce(cluster, "train", "-m", "cluster=multinode", "hydra/launcher=slurm",
                   "hydra.launcher.nodes=1", "hydra.launcher.gpus_per_node=8",
                   "cluster.nnodes=1", "comm=dense", f"results.dir={tmp_path}/x",
                   timeout=120)  # fmt: skip
    assert p.returncode == 2, p.stdout + p.stderr
    assert "hydra.launcher.gpus_per_node=8 cannot be satisfied on partition cpu" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.root
def test_slurm_up_holds_the_cluster_until_slurm_down_and_a_crash_leaves_nothing(
    nothing_left_behind,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "reproduce", "cluster", "slurm-up", "--nodes", "2"]
    up = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    line = up.stdout.readline()
    assert line.startswith("export SLURM_CONF=/"), line
    conf = line.strip().split("=", 1)[1]
    srun = subprocess.run(["srun", "-N2", "sh", "-c", "echo $SLURMD_NODENAME"],
                          env={**env, "SLURM_CONF": conf}, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert sorted(srun.stdout.split()) == ["node0", "node1"], srun.stderr
    down = subprocess.run([*cmd[:4], "slurm-down"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=90)  # fmt: skip
    assert down.returncode == 0 and "stopped" in down.stdout, down.stderr
    assert up.wait(timeout=30) == 0
    assert not Path(conf).exists()
    # a crash (kill -9 of the owner): the guardian removes the namespaces and the daemons
    up = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    conf = up.stdout.readline().strip().split("=", 1)[1]
    up.send_signal(signal.SIGKILL)
    up.wait()
    deadline = time.monotonic() + 30
    while any(_ours()["daemons"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    subprocess.run([*cmd[:4], "slurm-down"], cwd=REPO, env=env, capture_output=True, timeout=90)
    assert not Path(conf).exists()


@pytest.mark.slow
@pytest.mark.root
def test_the_protocols_quick_sweep_on_two_slurm_nodes_of_two_workers(
    tmp_path: Path, nothing_left_behind
) -> None:
    cluster = _cluster(nothing_left_behind, 2, cpus=4)
    p = _reproduce(cluster, "ablation", "--quick", "--comm", "dense,hitopk", "--order-seed", "7",
                   "--launcher", "slurm", "--sweep-id", "protocol-1",
                   "--results-dir", str(tmp_path), "cluster=multinode", "cluster.nnodes=2",
                   "cluster.nproc_per_node=2", "hydra.launcher.partition=cpu",
                   "train.epochs=1", *TINY, timeout=3600)  # fmt: skip
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "hydra.launcher.nodes=2" in out and "gpus_per_node" not in out
    p = _reproduce(cluster, "ablation", "--status", "protocol-1", "--results-dir", str(tmp_path),
                   timeout=120)  # fmt: skip
    assert p.returncode == 0 and "without a record" not in p.stdout, p.stdout + p.stderr
    import json

    recs = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert recs and all(r["status"] in ("ok", "target_missed") for r in recs), recs
    for r in recs:  # every run: its Slurm job and both nodes of its allocation
        assert r["slurm"]["nodes"] == ["node0", "node1"] and r["slurm"]["node"] == "node0", r
        job = f"slurm job {r['slurm']['job_id']} "
        line = next(ln for ln in p.stdout.splitlines() if job in ln)
        assert "COMPLETED, exit code 0" in line and f"run {r['run_id']} " in line, line
        assert "on node0,node1" in line, line
    # the same seeds through the local run queue on 2 x 2 workers: the same tables but for
    # the clocks
    from tests.test_sweep_submit import assert_same_as_the_local_run_queue

    assert_same_as_the_local_run_queue(tmp_path, "protocol-1", nnodes=2, nproc_per_node=2)
