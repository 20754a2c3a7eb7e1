"""The emulated cluster: parsing, refusals, namespaces up and gone, link check, launches.

Root-needing tests are marked ``root`` and skip cleanly without root or iproute2; the
ones that start torch.distributed workers are also ``slow``.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from bench.cluster import netns
from bench.cluster.emulated import (
    RendezvousTimeoutError,
    check_capacity,
    ensure_port_free,
    run_nodes,
)
from bench.cluster.linkcheck import run_link_check
from bench.registry import ConfigError
from tests.conftest import REPO

PROBE = "tests.helpers.cluster_probe"  # run as a module: the repo root must be on the path
PROBE_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
HAVE_ROOT = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
needs_root = [
    pytest.mark.root,
    pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)"),
]


def _mine(run_id: str) -> list[str]:
    return netns.list_resources().get(run_id, [])


@pytest.mark.parametrize(
    "text,bps", [("1gbit", 1e9), ("100mbit", 1e8), ("25Gbps", 25e9), ("2.5gbit", 2.5e9)]
)
def test_parse_bandwidth(text, bps):
    assert netns.parse_bandwidth(text) == pytest.approx(bps)


@pytest.mark.parametrize("text", ["fast", "1 parsec", "-1gbit", "0gbit", "gbit", ""])
def test_bad_bandwidth_is_one_clear_error(text):
    with pytest.raises(ConfigError, match="cannot parse the bandwidth"):
        netns.parse_bandwidth(text)


def test_parse_latency():
    assert netns.parse_latency("0.2ms") == pytest.approx(2e-4)
    assert netns.parse_latency("50us") == pytest.approx(5e-5)
    assert netns.parse_latency("0") == 0.0
    with pytest.raises(ConfigError, match="latency"):
        netns.parse_latency("soon")


def test_capacity_and_subnet_refusals():
    check_capacity(2, 2)
    with pytest.raises(ConfigError, match="cores can hold|GiB of memory"):
        check_capacity(64, 4096)
    with pytest.raises(ConfigError, match=">= 1"):
        check_capacity(0, 2)
    with pytest.raises(ConfigError, match="private"):
        netns.EmulatedCluster(2, 1e9, subnet="8.8.8.0/24")
    with pytest.raises(ConfigError, match="no room"):
        netns.EmulatedCluster(8, 1e9, subnet="10.213.0.0/29")


def test_port_in_use_is_refused():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        with pytest.raises(ConfigError, match="already in use"):
            ensure_port_free("127.0.0.1", port)
    finally:
        s.close()
    ensure_port_free("127.0.0.1", port)


def test_refuses_without_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="needs root"):
        netns.require_tools()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "tc" else "/x")
    with pytest.raises(ConfigError, match="'tc'"):
        netns.require_tools()


@pytest.mark.root
@pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)")
def test_namespaces_come_up_shaped_and_are_removed():
    c = netns.EmulatedCluster(3, 1e9, 2e-4)
    try:
        with c:
            names = _mine(c.run_id)
            for i in range(3):
                assert f"netns:{c.ns(i)}" in names
                addr = subprocess.run(
                    c.exec_argv(i, ["ip", "-o", "-4", "addr"]), capture_output=True, text=True
                ).stdout
                assert c.addr(i) in addr and "127.0.0.1" in addr  # loopback is up
                q = subprocess.run(
                    ["tc", "-n", c.ns(i), "qdisc", "show", "dev", c.ifname(i)],
                    capture_output=True,
                    text=True,
                ).stdout
                assert "tbf" in q and "rate 1Gbit" in q
                q_in = subprocess.run(
                    ["tc", "qdisc", "show", "dev", c.host_if(i)], capture_output=True, text=True
                ).stdout
                assert "tbf" in q_in and "rate 1Gbit" in q_in  # what node i receives
            assert f"link:{c.bridge}" in names
            assert max(len(n.split(":", 1)[1]) for n in names if n.startswith("link:")) <= 15
            raise RuntimeError("boom")  # removal on error
    except RuntimeError:
        pass
    assert _mine(c.run_id) == []


@pytest.mark.root
@pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)")
def test_leftovers_of_a_dead_run_are_removed_and_live_ones_kept():
    dead = netns.EmulatedCluster(2, 1e9)
    dead.up()
    # pretend its owner and its guardian crashed: a pid that cannot exist, and no teardown
    guardian = netns.read_state(dead.run_id)["guardian"]
    os.kill(guardian["pid"], signal.SIGKILL)
    (netns.STATE_DIR / f"{dead.run_id}.json").write_text(json.dumps({"pid": 2**22 + 7}))
    dead._up = False
    dead._restore_handlers()
    os.close(dead._guardian_fd)
    with netns.EmulatedCluster(2, 1e9) as live:
        assert _mine(dead.run_id) == []  # removed by live.up()
        assert not [n for n in netns.cleanup_leftovers() if live.run_id in n]  # not touched
        assert _mine(live.run_id)
    assert _mine(live.run_id) == []


@pytest.mark.root
@pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)")
def test_sigterm_removes_everything():
    code = textwrap.dedent("""
        import sys, time
        from bench.cluster.netns import EmulatedCluster
        c = EmulatedCluster(2, 1e9).up()
        print(c.run_id, flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    run_id = p.stdout.readline().strip()
    assert _mine(run_id)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert _mine(run_id) == []


@pytest.mark.root
@pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)")
def test_link_check_measures_the_shaped_link():
    with netns.EmulatedCluster(2, netns.parse_bandwidth("200mbit")) as c:
        r = run_link_check(c, tolerance=0.25, seconds=0.25)
    assert r["ok"] and abs(r["bandwidth_ratio"] - 1) <= 0.25
    # every node's link both ways, bulk and small messages after an idle gap
    assert {(m["src"], m["dst"]) for m in r["links"]} == {(0, 1), (1, 0)}
    assert all(abs(m["small_ratio"] - 1) <= 0.25 for m in r["links"])
    assert r["small_message_bytes"] == 48_000 and r["burst_bytes"] < 0.25 * 48_000
    # a node's own address is routed over loopback: not shaped
    assert r["intra_node_bandwidth_gbps"] > 2 * r["bandwidth_gbps"]
    assert r["rtt_ms"] > 0


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)")
def test_two_node_run_completes_and_a_failing_worker_cleans_up(tmp_path):
    with netns.EmulatedCluster(2, 1e9) as c:
        rc = run_nodes(
            c,
            2,
            PROBE,
            ["--out", str(tmp_path / "ok")],
            rdzv_timeout_s=120,
            timeout_s=400,
            env=PROBE_ENV,
        )
        run_id = c.run_id
    assert rc == 0 and _mine(run_id) == []
    recs = [json.loads((tmp_path / "ok" / f"rank{r}.json").read_text()) for r in range(4)]
    assert all(r["allreduce_sum"] == 10.0 and r["world"] == 4 for r in recs)
    assert {r["ifname"] for r in recs} == {c.ifname(0), c.ifname(1)}
    with netns.EmulatedCluster(2, 1e9) as c:
        rc = run_nodes(
            c,
            2,
            PROBE,
            ["--out", str(tmp_path / "fail"), "--fail-rank", "3"],
            rdzv_timeout_s=120,
            timeout_s=400,
            env=PROBE_ENV,
        )
        run_id = c.run_id
    assert rc != 0 and _mine(run_id) == []


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)")
def test_rendezvous_that_never_completes_times_out(tmp_path):
    t0 = time.monotonic()
    with netns.EmulatedCluster(2, 1e9) as c:
        with pytest.raises(RendezvousTimeoutError, match="did not complete within 5 s"):
            run_nodes(
                c,
                1,
                PROBE,
                ["--out", str(tmp_path)],
                rdzv_timeout_s=5,
                start_nodes=[0],
                timeout_s=300,
                env=PROBE_ENV,
            )
        run_id = c.run_id
    assert _mine(run_id) == [] and time.monotonic() - t0 < 300


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)")
def test_ctrl_c_during_a_run_stops_the_workers_and_removes_everything(tmp_path):
    code = textwrap.dedent(f"""
        from bench.cluster.netns import EmulatedCluster
        from bench.cluster.emulated import run_nodes
        with EmulatedCluster(2, 1e9) as c:
            print(c.run_id, flush=True)
            run_nodes(c, 1, {PROBE!r}, ["--out", {str(tmp_path)!r}, "--sleep", "300"],
                      rdzv_timeout_s=120, env={PROBE_ENV!r})
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    run_id = p.stdout.readline().strip()
    ns1 = f"tkb-{run_id}-n1"
    pids: list[str] = []
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        # node 1's agent and its worker: wait for both processes
        pids = subprocess.run(
            ["ip", "netns", "pids", ns1], capture_output=True, text=True
        ).stdout.split()
        if len(pids) >= 2:
            break
        time.sleep(1)
    assert len(pids) >= 2, "the workers did not start"
    p.send_signal(signal.SIGINT)
    p.wait(timeout=60)
    assert _mine(run_id) == []
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read()
