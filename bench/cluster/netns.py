"""A small public-cloud cluster emulated on one Linux machine.

One network namespace per node, joined by a Linux bridge through veth pairs.  Each node's
link is shaped in both directions with ``tc tbf``: on the node-side veth (what the node
sends) and on the bridge-side veth (what the bridge delivers to the node), so a node's
link is full duplex at the nominal rate each way and never more -- two nodes sending to a
third share the third node's rate.  Where the kernel has ``sch_netem``, ``netem delay``
adds the one-way latency on the sending side.  Inside a node, workers talk over loopback
(traffic to a node's own address is routed over ``lo``, so it is not shaped): fast links
inside a node, a slow link between nodes -- the setting of Shi et al. (MLSys 2021).

The token bucket (:func:`shaping`) holds ``max(4 full frames, 20 us at the rate)``, so a
message sent after an idle gap is shaped too (at most 6 kB pass at wire speed below
2.4 Gbit/s); the queue behind it holds ``max(64 KiB, 2 ms at the rate)``, a switch port's
buffer that still takes one full TCP segmentation burst (64 KiB), and drops beyond that
(tail drop): a request waits behind a bulk transfer at most the bucket plus the queue,
57 ms at 10 Mbit/s, 5.7 ms at 100 Mbit/s, about 2 ms above 260 Mbit/s.

Names carry the project prefix ``tkb`` and a 6-hex-digit run id claimed through
:mod:`bench.cluster.netstate`, which also records the owner (pid and start time) and
starts a guardian that removes everything if the launcher dies without cleaning up::

    netns   tkb-<id>-n<i>      bridge  tkb<id>br
    veth    tkb<id>h<i> (bridge side) <-> tkb<id>n<i> (inside node i)

Addresses come from a private subnet that only these namespaces use; the root namespace
gets no address on the bridge (IPv6 is off on the bridge and the veths), and the
namespaces have no default route, so traffic can never leave the emulated cluster.

CLI: ``python -m bench.cluster list`` (resources by run id and their owners) and
``python -m bench.cluster cleanup`` (remove those of runs whose owner is dead).
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import sys
from types import FrameType
from typing import Any

from bench.cluster import netstate
from bench.cluster.netstate import (  # noqa: F401  (STATE_DIR, list_resources: re-exported)
    PREFIX,
    STATE_DIR,
    cleanup_leftovers,
    list_resources,
)
from bench.registry import ConfigError

FRAME = 1514  # bytes of a full Ethernet frame (MTU 1500), as tbf counts them
BURST_FRAMES, BURST_S = 4, 20e-6  # token bucket: max(4 frames, 20 us at the rate)
QUEUE_MIN, QUEUE_S = 65536, 2e-3  # queue behind it: max(64 KiB, 2 ms at the rate)

_BW_UNITS = {  # bits per second; tc's spelling (kbit, mbit, gbit) plus the usual "Gbps"
    "bit": 1.0,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 1.0,
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
    "tbps": 1e12,
}
_LAT_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}


def parse_bandwidth(text: str) -> float:
    """``"1gbit"``, ``"100mbit"``, ``"25Gbps"`` -> bits per second (> 0)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]+)\s*", str(text).lower())
    if not m or m.group(2) not in _BW_UNITS or float(m.group(1)) <= 0:
        raise ConfigError(
            f"cannot parse the bandwidth {text!r}; write a positive number and a unit, "
            "e.g. 100mbit, 1gbit, 25gbit"
        )
    return float(m.group(1)) * _BW_UNITS[m.group(2)]


def parse_latency(text: str) -> float:
    """``"0.2ms"``, ``"200us"``, ``"0"`` -> seconds (>= 0)."""
    s = str(text).strip().lower()
    if s in ("0", "0.0", ""):
        return 0.0
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]+)", s)
    if not m or m.group(2) not in _LAT_UNITS:
        raise ConfigError(
            f"cannot parse the latency {text!r}; write a number and a unit, e.g. 0.2ms, 50us"
        )
    return float(m.group(1)) * _LAT_UNITS[m.group(2)]


def require_tools() -> None:
    """Refuse, in one sentence, when the emulator cannot work here."""
    if os.geteuid() != 0:
        raise ConfigError(
            "cluster=emulated needs root (it creates network namespaces and tc qdiscs); "
            "run as root or use cluster=local"
        )
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise ConfigError(
                f"cluster=emulated needs the '{tool}' command of iproute2 "
                "(apt-get install iproute2)"
            )


def shaping(rate_bps: float) -> tuple[int, int]:
    """tbf's ``burst`` and ``limit`` (bytes) for a link of ``rate_bps``.

    The bucket is a few frames, so a message after an idle gap is shaped like a long
    transfer (a bucket of 1 ms or 64 KiB let whole 40-60 kB messages pass at wire speed);
    above 2.4 Gbit/s it is 20 us at the rate, the timer granularity that keeps the rate
    accurate.  The queue is what a switch port buffers, at least one 64 KiB segmentation
    burst of TCP (a smaller one drops the tail of every such burst); beyond it packets are
    dropped.
    """
    burst = max(BURST_FRAMES * FRAME, int(rate_bps / 8 * BURST_S))
    queue = max(QUEUE_MIN, int(rate_bps / 8 * QUEUE_S))
    return burst, burst + queue


_run = netstate.run_cmd


class EmulatedCluster:
    """``nodes`` namespaces on one bridge, each node's link shaped to ``bandwidth_bps``.

    Use as a context manager; :meth:`down` is idempotent and also runs from ``atexit``
    and on SIGINT/SIGTERM/SIGHUP (the handler raises ``KeyboardInterrupt`` /
    ``SystemExit(128 + signal)`` so that ``finally`` blocks of the caller run too).  If
    this process dies without running it (``kill -9``), the run's guardian removes
    everything within a second.
    """

    def __init__(
        self,
        nodes: int,
        bandwidth_bps: float,
        latency_s: float = 0.0,
        subnet: str = "10.213.0.0/24",
        run_id: str | None = None,
    ) -> None:
        if nodes < 1:
            raise ConfigError(f"an emulated cluster needs at least 1 node, got {nodes}")
        if nodes > 999:
            raise ConfigError(f"an emulated cluster has at most 999 nodes, got {nodes}")
        if run_id is not None and not re.fullmatch(r"[0-9a-f]{6}", run_id):
            raise ConfigError(f"an emulated cluster id is 6 hex digits, got {run_id!r}")
        try:
            net = ipaddress.ip_network(subnet, strict=False)
        except ValueError:
            raise ConfigError(f"cannot parse the subnet {subnet!r}; e.g. 10.213.0.0/24") from None
        if net.version != 4 or not net.is_private:
            raise ConfigError(f"the emulated cluster's subnet {subnet} must be a private IPv4 one")
        if nodes > net.num_addresses - 2:
            raise ConfigError(f"the subnet {subnet} has no room for {nodes} nodes")
        self.nodes = nodes
        self.bandwidth_bps = bandwidth_bps
        self.latency_s = latency_s
        self.net = net
        self.run_id = run_id or ""  # claimed by up()
        self._wanted_id = run_id
        self.latency_emulated = False
        self._up = False
        self._guardian_fd: int | None = None
        self._old_handlers: dict[int, Any] = {}

    # --- names (interface names are limited to 15 characters) ---
    def ns(self, i: int) -> str:
        return f"{PREFIX}-{self.run_id}-n{i}"

    def ifname(self, i: int) -> str:
        """The node-side veth of node ``i`` (GLOO_SOCKET_IFNAME inside its namespace)."""
        return f"{PREFIX}{self.run_id}n{i}"

    def host_if(self, i: int) -> str:
        """The bridge-side veth of node ``i``: its egress is what node ``i`` receives."""
        return f"{PREFIX}{self.run_id}h{i}"

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.run_id}br"

    def addr(self, i: int) -> str:
        return str(self.net.network_address + i + 1)

    def exec_argv(self, i: int, argv: list[str]) -> list[str]:
        """``argv`` run inside node ``i``'s namespace."""
        return ["ip", "netns", "exec", self.ns(i), *argv]

    # --- life cycle ---
    def up(self) -> EmulatedCluster:
        require_tools()
        cleanup_leftovers()
        self.run_id = netstate.claim(self._wanted_id, nodes=self.nodes)
        self._install_handlers()
        self._up = True  # from here on, down() has something to remove
        try:
            self._guardian_fd = netstate.start_guardian(self.run_id)
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "addrgenmode", "none")  # no IPv6 address
        _run("ip", "link", "set", self.bridge, "up")
        netem_ok = self.latency_s > 0 and self._has_netem()
        if self.latency_s > 0 and not netem_ok:
            print(
                "warning: this kernel has no sch_netem, so the inter-node latency is not "
                "emulated (the link check records the measured one)",
                file=sys.stderr,
            )
        self.latency_emulated = netem_ok
        for i in range(self.nodes):
            self._add_node(i, netem_ok)

    def _add_node(self, i: int, netem: bool) -> None:
        ns, nif, hif = self.ns(i), self.ifname(i), self.host_if(i)
        _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", hif, "type", "veth", "peer", "name", nif, "netns", ns)
        _run("ip", "link", "set", hif, "addrgenmode", "none")
        _run("ip", "link", "set", hif, "master", self.bridge, "up")
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "-n", ns, "link", "set", nif, "addrgenmode", "none")
        _run("ip", "-n", ns, "addr", "add", f"{self.addr(i)}/{self.net.prefixlen}", "dev", nif)
        _run("ip", "-n", ns, "link", "set", nif, "up")
        parent = ["root", "handle", "1:"]
        if netem:
            delay = f"{self.latency_s * 1e6:.0f}us"
            tc = ["tc", "-n", ns, "qdisc", "add", "dev", nif, "root", "handle", "1:"]
            _run(*tc, "netem", "delay", delay, "limit", "100000")
            parent = ["parent", "1:", "handle", "2:"]
        self._tbf(["tc", "-n", ns], nif, parent)  # what node i sends
        self._tbf(["tc"], hif, ["root", "handle", "1:"])  # what node i receives

    def _tbf(self, tc: list[str], dev: str, parent: list[str]) -> None:
        burst, limit = shaping(self.bandwidth_bps)
        rate = f"{int(self.bandwidth_bps)}bit"
        _run(*tc, "qdisc", "add", "dev", dev, *parent, "tbf", "rate", rate,
             "burst", str(burst), "limit", str(limit))  # fmt: skip

    def _has_netem(self) -> bool:
        """Whether ``tc ... netem`` works here (a probe on a throw-away veth pair)."""
        probe = f"{PREFIX}{self.run_id}h998"
        peer = f"{PREFIX}{self.run_id}h999"
        if _run("ip", "link", "add", probe, "type", "veth", "peer", "name", peer,
                check=False).returncode != 0:  # fmt: skip
            return False
        try:
            r = _run(
                "tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms", check=False
            )
            return r.returncode == 0
        finally:
            _run("ip", "link", "del", probe, check=False)

    def down(self) -> None:
        """Remove every namespace, link and qdisc of this run (idempotent); resources of
        another live run are never touched."""
        if not self._up:
            return
        self._up = False
        try:
            if netstate.owned_by_me(self.run_id):
                netstate.remove_run(self.run_id)
        finally:
            if self._guardian_fd is not None:
                os.close(self._guardian_fd)  # the guardian finds nothing left and exits
                self._guardian_fd = None
            self._restore_handlers()

    def _install_handlers(self) -> None:
        atexit.register(self.down)

        def handler(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError):  # not the main thread: finally/atexit
                self._old_handlers[sig] = signal.signal(sig, handler)

    def _restore_handlers(self) -> None:
        atexit.unregister(self.down)
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError):
                signal.signal(sig, old)
        self._old_handlers.clear()

    def __enter__(self) -> EmulatedCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def describe(self) -> dict[str, Any]:
        burst, limit = shaping(self.bandwidth_bps)
        return {
            "run_id": self.run_id,
            "nodes": self.nodes,
            "bandwidth_bps": self.bandwidth_bps,
            "latency_s": self.latency_s,
            "latency_emulated": self.latency_emulated,
            "burst_bytes": burst,
            "queue_bytes": limit - burst,
            "addresses": [self.addr(i) for i in range(self.nodes)],
        }


def main(argv: list[str]) -> int:
    """``list`` or ``cleanup``."""
    cmd = argv[0] if argv else "list"
    if cmd == "cleanup":
        print("\n".join(cleanup_leftovers()) or "nothing to remove")
    elif cmd == "list":
        print(json.dumps(netstate.describe_all(), indent=1))
    else:
        print(f"error: unknown command {cmd!r}; use list or cleanup", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # python -m bench.cluster [list|cleanup] says the same
    raise SystemExit(main(sys.argv[1:]))
