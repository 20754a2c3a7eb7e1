"""The emulated link shapes what the node-level numbers depend on (root, seconds each):

- a small message after an idle gap takes its nominal time (a large token bucket let
  40-60 kB pass at wire speed, so hitopk's per-bucket traffic was effectively unshaped);
- a node receives at the nominal rate at most, also when two nodes send to it at once;
- a request waits behind a bulk transfer no longer than the documented queue;
- the bridge has no address, IPv6 included.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from bench.cluster import netns
from bench.cluster.linkcheck import _run_pair

HAVE_ROOT = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)"),
]


def _small_message_s(c: netns.EmulatedCluster, nbytes: int, gap_s: float) -> dict:
    """Five ``nbytes`` messages from node 0 to node 1, each after ``gap_s`` idle."""
    args = ["0", "10", "5", str(nbytes), str(gap_s)]  # no bulk transfer first
    return _run_pair(c, 1, 0, c.addr(1), 29399, args)


@pytest.mark.parametrize("rate,nbytes", [(10e6, 60_000), (100e6, 40_000)])
def test_a_small_message_after_an_idle_gap_is_shaped(rate, nbytes):
    with netns.EmulatedCluster(2, rate) as c:
        m = _small_message_s(c, nbytes, gap_s=0.1)
    nominal = nbytes * 8 / rate
    # at most one token bucket (4 frames, 6 kB) passes at wire speed
    assert min(m["small_all_s"]) >= 0.75 * nominal, (m, nominal)
    # the fastest of five within 1.5x, plus 2 ms of scheduling: at 100 Mbit/s a 3.2 ms
    # message measures 0.85-2.7x nominal one by one on a quiet 2-core machine
    assert m["small_s"] <= 1.5 * nominal + 0.002, (m, nominal)


RECEIVER = textwrap.dedent("""
    import json, socket, sys, threading, time
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((sys.argv[1], int(sys.argv[2]))); srv.listen(4)
    print("ready", flush=True)
    got = [0, 0]
    def drain(c, k):
        while True:
            n = len(c.recv(1 << 16))
            if not n:
                return
            got[k] += n
    conns = [srv.accept()[0] for _ in range(2)]
    for k, c in enumerate(conns):
        threading.Thread(target=drain, args=(c, k), daemon=True).start()
    time.sleep(0.4)  # both flows running, queues filled
    b0, t0 = list(got), time.perf_counter()
    time.sleep(1.2)
    b1, t1 = list(got), time.perf_counter()
    print(json.dumps({"bps": [(y - x) * 8 / (t1 - t0) for x, y in zip(b0, b1)]}), flush=True)
""")
SENDER = textwrap.dedent("""
    import socket, sys, time
    c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
    data = b"\\0" * (1 << 16)
    end = time.monotonic() + float(sys.argv[3])
    try:
        while time.monotonic() < end:
            c.sendall(data)
    except OSError:
        pass
""")


def test_fan_in_from_two_nodes_is_limited_to_the_receivers_rate():
    rate = 20e6
    with netns.EmulatedCluster(3, rate) as c:
        py = sys.executable
        host, port = c.addr(2), "29398"
        rx = subprocess.Popen(
            c.exec_argv(2, [py, "-c", RECEIVER, host, port]), stdout=subprocess.PIPE, text=True
        )
        try:
            assert rx.stdout.readline().strip() == "ready"
            tx = [
                subprocess.Popen(c.exec_argv(i, [py, "-c", SENDER, host, port, "3"]))
                for i in (0, 1)
            ]
            out = json.loads(rx.stdout.readline())
            for p in tx:
                p.wait(timeout=30)
        finally:
            rx.kill()
            rx.wait()
    total = sum(out["bps"])
    # each sender's own link allows `rate`; without shaping what node 2 receives, 2x
    # (how the two flows share it is TCP's business: tail drop may starve one for a while)
    assert 0.75 * rate <= total <= 1.25 * rate, out


def test_a_request_waits_behind_a_bulk_transfer_at_most_the_queue():
    rate = 10e6
    burst, limit = netns.shaping(rate)
    with netns.EmulatedCluster(2, rate) as c:
        py = sys.executable
        # a bulk flow 0 -> 1 fills node 0's queue; then 20 pings 0 -> 1 on another flow
        host = c.addr(1)
        rx = subprocess.Popen(
            c.exec_argv(1, [py, "-c", RECEIVER, host, "29398"]), stdout=subprocess.PIPE, text=True
        )
        try:
            assert rx.stdout.readline().strip() == "ready"
            bulk = subprocess.Popen(c.exec_argv(0, [py, "-c", SENDER, host, "29398", "4"]))
            srv = subprocess.Popen(
                c.exec_argv(1, [py, "-m", "bench.cluster.linkprobe", "serve", host, "29399"]),
                stdout=subprocess.PIPE,
                text=True,
            )
            assert srv.stdout.readline().strip() == "ready"
            ping = subprocess.run(
                c.exec_argv(0, [py, "-m", "bench.cluster.linkprobe", "blast", host, "29399",
                                "0", "12"]),
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            srv.wait(timeout=10)
            bulk.kill()
        finally:
            rx.kill()
            rx.wait()
    rtt = json.loads(ping.stdout)["rtt_s"]
    # the queue holds `limit` bytes: 64 KiB + 6 kB = 57 ms at 10 Mbit/s (was 140 ms)
    assert rtt <= 1.5 * limit * 8 / rate, (rtt, limit)


def test_the_bridge_has_no_address_and_both_directions_are_shaped():
    with netns.EmulatedCluster(2, 100e6) as c:
        addrs = subprocess.run(
            ["ip", "-o", "addr", "show", "dev", c.bridge], capture_output=True, text=True
        ).stdout
        assert addrs.strip() == ""
        for i in range(2):
            q_out = subprocess.run(
                ["tc", "-n", c.ns(i), "qdisc", "show", "dev", c.ifname(i)],
                capture_output=True,
                text=True,
            ).stdout
            q_in = subprocess.run(
                ["tc", "qdisc", "show", "dev", c.host_if(i)], capture_output=True, text=True
            ).stdout
            for q in (q_out, q_in):
                assert "tbf" in q and "rate 100Mbit" in q, q


def test_the_link_check_refuses_a_bucket_that_lets_small_messages_through(monkeypatch):
    from bench.cluster.linkcheck import LinkCheckError, run_link_check

    monkeypatch.setattr(netns, "BURST_FRAMES", 44)  # the old 64 KiB bucket
    with netns.EmulatedCluster(2, 100e6) as c:
        # a small message passes a 64 KiB bucket at line rate only when the bucket has
        # refilled since the bulk transfer; on a loaded machine one check can miss that,
        # so the leak must show in one of 3 checks (each a fresh measurement)
        checks = [run_link_check(c, 0.25, 0.2, intra=False, attempts=1, strict=False)]
        while checks[-1]["ok"] and len(checks) < 3:
            checks.append(run_link_check(c, 0.25, 0.2, intra=False, attempts=1, strict=False))
        r = checks[-1]
        # flagged for the reason the check gives: small messages faster than the rate
        # allows by more than its tolerance (a loaded CI run measured 0.52 of nominal)
        assert not r["ok"] and r["small_message_ratio"] < 1 - 0.25, checks  # bulk looks fine
        assert all(abs(m["bandwidth_ratio"] - 1) <= 0.25 for m in r["links"]), r
        for _ in range(3):
            try:
                run_link_check(c, 0.25, 0.2, intra=False, attempts=1)
            except LinkCheckError as e:
                assert "48000 B message takes" in str(e)
                break
        else:
            pytest.fail("the strict link check accepted a leaky bucket in 3 checks")
