"""Link check of an emulated cluster: is the link between two nodes what it claims?

A TCP server in node 1's namespace receives a blast of ``link_check_s`` seconds of
data at the nominal rate from node 0 and acknowledges it; the client times first byte
to acknowledgement (bandwidth) and, before that, 1-byte ping-pongs (round-trip time;
one-way latency = RTT / 2).  The same blast to node 0's own address inside its
namespace measures the intra-node (loopback, unshaped) path for comparison.

The result is written as ``link_check.json`` beside the run's json and passed to the
workers in ``BENCH_LINK_CHECK``, so that the run record keeps it under ``link_check``.
The run refuses to start when the measured bandwidth is off by more than the tolerance.

CLI (used inside the namespaces)::

    python -m bench.cluster.linkcheck serve HOST PORT
    python -m bench.cluster.linkcheck blast HOST PORT NBYTES [PINGS]   # prints JSON
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.cluster.netns import EmulatedCluster
from bench.registry import ConfigError

CHUNK = 1 << 20  # bytes per send/recv call


class LinkCheckError(ConfigError):
    """The emulated link does not deliver its configured bandwidth."""


def serve(host: str, port: int, conns: int = 1) -> None:
    """Accept ``conns`` connections: answer pings, then receive a blast and ack it."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(1)
    print("ready", flush=True)
    buf = bytearray(CHUNK)
    for _ in range(conns):
        c, _ = srv.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with c:
            pings = int.from_bytes(_recv_exact(c, 4), "big")
            for _ in range(pings):
                c.sendall(_recv_exact(c, 1))
            n = int.from_bytes(_recv_exact(c, 8), "big")
            got = 0
            while got < n:
                r = c.recv_into(buf, min(CHUNK, n - got))
                if r == 0:
                    raise ConnectionError("the link check client went away")
                got += r
            c.sendall(b"k")
    srv.close()


def _recv_exact(c: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        r = c.recv(n - len(out))
        if not r:
            raise ConnectionError("the link check peer went away")
        out += r
    return out


def blast(host: str, port: int, nbytes: int, pings: int = 20, connect_s: float = 10.0) -> dict:
    """Client side: RTT by ping-pong, then bandwidth of one ``nbytes`` transfer."""
    deadline = time.monotonic() + connect_s
    while True:
        try:
            c = socket.create_connection((host, port), timeout=60)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with c:
        c.sendall(pings.to_bytes(4, "big"))
        rtts = []
        for _ in range(pings):
            t0 = time.perf_counter()
            c.sendall(b"p")
            _recv_exact(c, 1)
            rtts.append(time.perf_counter() - t0)
        c.sendall(nbytes.to_bytes(8, "big"))
        data = memoryview(b"\0" * CHUNK)
        t0 = time.perf_counter()
        sent = 0
        while sent < nbytes:
            sent += c.send(data[: min(CHUNK, nbytes - sent)])
        _recv_exact(c, 1)
        dt = time.perf_counter() - t0
    rtt = statistics.median(rtts[2:] if len(rtts) > 4 else rtts)  # first pings warm up
    # the ack costs half an RTT beyond the last byte's arrival
    return {
        "bytes": nbytes,
        "seconds": dt,
        "bps": nbytes * 8 / max(dt - rtt / 2, 1e-9),
        "rtt_s": rtt,
    }


def _pair(
    cluster: EmulatedCluster, server_node: int, client_node: int, host: str, port: int, nbytes: int
) -> dict:
    py = sys.executable
    srv = subprocess.Popen(
        cluster.exec_argv(
            server_node, [py, "-m", "bench.cluster.linkcheck", "serve", host, str(port)]
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = srv.stdout.readline() if srv.stdout else ""
        if ready.strip() != "ready":
            err = srv.stderr.read() if srv.stderr else ""
            raise LinkCheckError(
                f"the link check server in node {server_node} did not start on {host}:{port}: "
                f"{err.strip().splitlines()[-1] if err.strip() else 'no output'}"
            )
        cli = subprocess.run(
            cluster.exec_argv(
                client_node,
                [py, "-m", "bench.cluster.linkcheck", "blast", host, str(port), str(nbytes)],
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if cli.returncode != 0:
            raise LinkCheckError(
                f"the link check from node {client_node} to {host}:{port} failed: "
                f"{cli.stderr.strip().splitlines()[-1] if cli.stderr.strip() else cli.returncode}"
            )
        return json.loads(cli.stdout)
    finally:
        try:
            srv.wait(timeout=10)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def run_link_check(
    cluster: EmulatedCluster,
    tolerance: float = 0.25,
    seconds: float = 0.5,
    port: int = 29399,
    intra: bool = True,
    attempts: int = 3,
    strict: bool = True,
) -> dict[str, Any]:
    """Measure node 0 -> node 1 (and node 0 -> itself); raise when off by > tolerance.

    Up to ``attempts`` transfers, keeping the one closest to the nominal rate: on a
    shared machine a busy moment slows one transfer, not the link.  ``strict=False``
    records ``ok: false`` instead of raising (benchmarks that calibrate on the measured link).
    """
    if cluster.nodes < 2:
        return {"skipped": "one node: no inter-node link"}
    expected = cluster.bandwidth_bps
    # at least 1 MiB, at most 4 GiB of traffic
    nbytes = int(min(max(expected / 8 * seconds, 1 << 20), 4 << 30))
    inter: dict[str, Any] = {}
    for _ in range(max(1, attempts)):
        m = _pair(cluster, 1, 0, cluster.addr(1), port, nbytes)
        if not inter or abs(m["bps"] / expected - 1) < abs(inter["bps"] / expected - 1):
            inter = m
        if abs(inter["bps"] / expected - 1) <= tolerance / 2:
            break
    out: dict[str, Any] = {
        "expected_bandwidth_gbps": expected / 1e9,
        "bandwidth_gbps": inter["bps"] / 1e9,
        "bandwidth_ratio": inter["bps"] / expected,
        "expected_latency_ms": cluster.latency_s * 1e3,
        "latency_ms": inter["rtt_s"] / 2 * 1e3,  # one way
        "rtt_ms": inter["rtt_s"] * 1e3,
        "latency_emulated": cluster.latency_emulated,
        "transfer_bytes": nbytes,
        "transfer_s": inter["seconds"],
        "tolerance": tolerance,
        "nodes": cluster.nodes,
        "run_id": cluster.run_id,
    }
    if intra:
        # same namespace, node 0's own veth address: routed over lo, so not shaped
        loc = _pair(cluster, 0, 0, cluster.addr(0), port, max(nbytes, 64 << 20))
        out["intra_node_bandwidth_gbps"] = loc["bps"] / 1e9
        out["intra_node_rtt_ms"] = loc["rtt_s"] * 1e3
    out["ok"] = abs(out["bandwidth_ratio"] - 1.0) <= tolerance
    if not out["ok"] and strict:
        raise LinkCheckError(
            f"the emulated link measures {out['bandwidth_gbps']:.3g} Gbit/s instead of "
            f"{expected / 1e9:.3g} Gbit/s (more than {tolerance:.0%} off); lower "
            "cluster.inter_node_bandwidth or free the machine's CPUs"
        )
    return out


def write_link_check(result: dict[str, Any], run_json: Path) -> Path:
    """``link_check.json`` beside the run's json; its path goes into ``BENCH_LINK_CHECK``."""
    path = Path(run_json).with_name("link_check.json")
    path.write_text(json.dumps(result, indent=1))
    return path


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "blast":
        pings = int(sys.argv[5]) if len(sys.argv) > 5 else 20
        print(json.dumps(blast(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), pings)))
    else:
        raise SystemExit("usage: python -m bench.cluster.linkcheck serve|blast HOST PORT [N]")
