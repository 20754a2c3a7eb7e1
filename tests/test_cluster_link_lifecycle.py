"""An emulated cluster leaves nothing behind and destroys nothing of another run.

Without root: the owner of a run is a pid *and* its start time (a reused pid is not the
owner), and threads per worker respect the launcher's ``OMP_NUM_THREADS``.  With root
(seconds each): ``kill -9`` of a launcher removes its namespaces, links, state file and
processes, and what ran in the namespaces never writes its output; SIGHUP tears down like
SIGTERM; runs started at once get distinct ids and leave each other alone.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bench.cluster import netns
from bench.cluster.emulated import worker_threads
from bench.registry import ConfigError
from tests.conftest import REPO

HAVE_ROOT = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
needs_root = pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)")
PATH = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
ENV = {**os.environ, "PYTHONPATH": PATH}

# a launcher: a 2-node cluster, a process in each node that writes OUT after 60 s, then wait
# (a process found dead before then can never write)
LAUNCHER = textwrap.dedent("""
    import json, subprocess, sys, time
    from bench.cluster.netns import EmulatedCluster
    c = EmulatedCluster(2, 10e6).up()
    code = f"import time; time.sleep(60); open({sys.argv[1]!r}, 'a').write('ok')"
    procs = [subprocess.Popen(c.exec_argv(i, [sys.executable, "-c", code]),
                              start_new_session=True) for i in range(2)]
    print(json.dumps({"run_id": c.run_id, "pids": [p.pid for p in procs]}), flush=True)
    time.sleep(120)
""")


def test_a_reused_pid_is_not_the_owner():
    me = netns.identity()
    assert netns.is_alive(me)
    assert not netns.is_alive({**me, "start": me["start"] + 1})  # same pid, other process
    assert not netns.is_alive({"pid": 2**22 + 7, "start": 1})
    assert not netns.is_alive({})


def test_threads_per_worker(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert worker_threads(0, 4) == 3  # the launcher's setting wins
    assert worker_threads(2, 4) == 2  # ... unless the config names one
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert worker_threads(0, 4) == 2  # every emulated node's workers share this machine


# an "agent" that arms the parent-death signal and starts a "worker" that writes OUT after 3 s
AGENT = textwrap.dedent("""
    import subprocess, sys, time
    from bench.cluster.agent import die_with_launcher
    die_with_launcher()
    code = f"import time; time.sleep(3); open({sys.argv[1]!r}, 'a').write('ok')"
    w = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    print(w.pid, flush=True)
    time.sleep(60)
""")
PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    env = {**os.environ, "BENCH_LAUNCHER_PID": str(os.getpid())}
    a = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env,
                         stdout=subprocess.PIPE, text=True)
    print(a.pid, a.stdout.readline().strip(), flush=True)
    time.sleep(60)
""")


def test_an_agent_dies_with_its_launcher_and_kills_its_workers_first(tmp_path):
    out = tmp_path / "late.txt"
    p = subprocess.Popen(
        [sys.executable, "-c", PARENT, AGENT, str(out)], stdout=subprocess.PIPE, text=True,
        env=ENV,
    )  # fmt: skip
    try:
        agent, worker = (int(x) for x in p.stdout.readline().split())
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (netns.start_time(agent) or netns.start_time(worker)):
            time.sleep(0.05)
        assert netns.start_time(agent) is None and netns.start_time(worker) is None
        time.sleep(3.5)
        assert not out.exists()
    finally:
        p.kill()
        p.wait()


def test_a_bad_run_id_is_refused():
    with pytest.raises(ConfigError, match="6 hex digits"):
        netns.EmulatedCluster(2, 1e9, run_id="zz")


def _spawn(out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(out)], stdout=subprocess.PIPE, text=True, env=ENV
    )


def _started(p: subprocess.Popen) -> dict:
    info = json.loads(p.stdout.readline())
    info["guardian"] = netns.read_state(info["run_id"])["guardian"]
    return info


def _start_launcher(tmp_path: Path) -> tuple[subprocess.Popen, dict]:
    p = _spawn(tmp_path / "late.txt")
    return p, _started(p)


GONE_S = 30  # seconds a torn-down run may take to be gone


def _gone_within(info: dict, seconds: float) -> float:
    """Seconds until nothing of the run is left (namespaces, links, state, processes)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        left = netns.list_resources().get(info["run_id"], [])
        alive = [p for p in info["pids"] if netns.start_time(p) is not None]
        state = netns.state_path(info["run_id"]).exists()
        if not left and not alive and not state and not netns.is_alive(info["guardian"]):
            return time.monotonic() - t0
        time.sleep(0.05)
    guardian = netns.is_alive(info["guardian"])
    raise AssertionError(f"left after {seconds} s: {left} {alive} {state=} {guardian=}")


@pytest.mark.root
@needs_root
def test_kill_9_of_the_launcher_leaves_nothing_and_no_late_output(tmp_path):
    p, info = _start_launcher(tmp_path)
    try:
        assert netns.list_resources()[info["run_id"]]
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        # 0.2 s on a quiet machine; the kernel's namespace teardown can take seconds under
        # load, and the guardian's own wait for it gives up after 15 s
        _gone_within(info, GONE_S)  # well before the processes' 60 s: they can never write
        assert not (tmp_path / "late.txt").exists()
    finally:
        p.kill()
        p.wait()
        netns.cleanup_leftovers()


@pytest.mark.root
@needs_root
def test_sighup_tears_down_like_sigterm(tmp_path):
    p, info = _start_launcher(tmp_path)
    try:
        p.send_signal(signal.SIGHUP)
        assert p.wait(timeout=30) == 128 + signal.SIGHUP
        _gone_within(info, GONE_S)
    finally:
        p.kill()
        p.wait()


@pytest.mark.root
@needs_root
def test_runs_started_at_once_get_their_own_ids_and_leave_each_other_alone(tmp_path):
    procs = [_spawn(tmp_path / f"late{k}.txt") for k in range(2)]  # both at once
    try:
        a, b = (_started(p) for p in procs)
        assert a["run_id"] != b["run_id"]
        # a third run may neither take a live run's id nor remove its resources
        with pytest.raises(ConfigError, match="belongs to the live run"):
            netns.EmulatedCluster(2, 10e6, run_id=a["run_id"]).up()
        removed = netns.cleanup_leftovers()
        assert not [n for n in removed if a["run_id"] in n or b["run_id"] in n]
        procs[0].send_signal(signal.SIGTERM)
        procs[0].wait(timeout=30)
        _gone_within(a, GONE_S)
        names = netns.list_resources()[b["run_id"]]
        assert len(names) == 2 + 2 + 1  # b's namespaces, veths, bridge: untouched
    finally:
        for p in procs:
            p.kill()
            p.wait()
        netns.cleanup_leftovers()


AGENT_LAUNCHER = textwrap.dedent("""
    import json, sys
    from bench.cluster.netns import EmulatedCluster
    from bench.cluster.emulated import run_nodes
    with EmulatedCluster(2, 1e9) as c:
        print(json.dumps({"run_id": c.run_id}), flush=True)
        run_nodes(c, 1, "tests.helpers.cluster_probe", ["--out", sys.argv[1], "--sleep", "8"],
                  rdzv_timeout_s=120)
""")


@pytest.mark.slow
@pytest.mark.root
@needs_root
def test_kill_9_during_a_run_kills_agents_and_workers_before_they_record(tmp_path):
    out = tmp_path / "ranks"
    p = subprocess.Popen(
        [sys.executable, "-c", AGENT_LAUNCHER, str(out)], stdout=subprocess.PIPE, text=True,
        env=ENV,
    )  # fmt: skip
    try:
        info = _started(p)
        pids: list[str] = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(pids) < 4:  # 2 agents, 2 workers
            pids = [
                pid
                for i in range(2)
                for pid in subprocess.run(
                    ["ip", "netns", "pids", f"tkb-{info['run_id']}-n{i}"],
                    capture_output=True,
                    text=True,
                ).stdout.split()
            ]
            time.sleep(0.5)
        assert len(pids) >= 4, "the workers did not start"
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        info["pids"] = [int(x) for x in pids]
        _gone_within(info, GONE_S)
        time.sleep(10)  # past the probe's sleep: a surviving worker would write now
        assert not list(out.glob("rank*.json"))
    finally:
        p.kill()
        p.wait()
        netns.cleanup_leftovers()
