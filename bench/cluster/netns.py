"""A small public-cloud cluster emulated on one Linux machine.

One network namespace per node, joined by a Linux bridge through veth pairs; each
node's egress is shaped with ``tc``: ``tbf`` for the link rate and, where the kernel
has ``sch_netem``, ``netem delay`` for the one-way latency.  Inside a node, workers
talk over loopback (traffic to a node's own address is routed over ``lo``, so it is
not shaped): fast links inside a node, a slow link between nodes -- the setting of
Shi et al. (MLSys 2021), 8 V100 per node over NVLink, 25 Gbps Ethernet between nodes.

Names carry the project prefix ``tkb`` and a 4-hex-digit run id, so that leftovers of a
crashed run can be found and removed without touching anything else, and a live run
(whose owner pid is still alive) is never touched::

    netns   tkb-<id>-n<i>      bridge  tkb<id>br
    veth    tkb<id>h<i> (bridge side) <-> tkb<id>n<i> (inside node i)

Measured on a 2-core VM (kernel without ``sch_netem``, so no added latency): at ``tbf rate
1gbit`` the link check gets 0.95 Gbit/s from node 0 to node 1 and ~11 Gbit/s from node 0
to its own address (loopback, unshaped); a gloo allreduce of 25 MB takes 130-180 ms
among the 2 workers of one node and 350 ms among all 4 workers of 2 nodes (the 1 Gbit/s
bound is 315 ms).  ``tbf rate 10gbit`` is above what such a machine's veths carry under
load (5-9 Gbit/s measured).

Addresses come from a private subnet that only these namespaces use; the root
namespace gets no address on the bridge, and the namespaces have no default route, so
traffic can never leave the emulated cluster.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

from bench.registry import ConfigError

PREFIX = "tkb"
# owner pids of live runs: <STATE_DIR>/<id>.json
STATE_DIR = Path(os.environ.get("BENCH_NETNS_STATE", "/run/tkb-netns"))
_NS_RE = re.compile(rf"^{PREFIX}-([0-9a-f]{{4}})-n\d+$")
_LINK_RE = re.compile(rf"^{PREFIX}([0-9a-f]{{4}})(?:br|h\d+|n\d+)$")

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


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {p.stderr.strip()}")
    return p


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_resources() -> dict[str, list[str]]:
    """Every namespace and link named with the project prefix, by run id."""
    found: dict[str, list[str]] = {}
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = _NS_RE.match(name)
        if m:
            found.setdefault(m.group(1), []).append(f"netns:{name}")
    for line in _run("ip", "-o", "link", "show", check=False).stdout.splitlines():
        # "12: tkbab12h0@if11: <...>" -> tkbab12h0
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = _LINK_RE.match(name)
        if m:
            found.setdefault(m.group(1), []).append(f"link:{name}")
    return found


def _owner_alive(run_id: str) -> bool:
    try:
        pid = int(json.loads((STATE_DIR / f"{run_id}.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return False
    return _pid_alive(pid)


def _remove_run(run_id: str, names: list[str]) -> None:
    """Kill what runs in the run's namespaces, delete its links and namespaces, and wait."""
    namespaces = [n.split(":", 1)[1] for n in names if n.startswith("netns:")]
    for ns in namespaces:
        pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for n in names:
        if n.startswith("link:"):
            # deleting one end of a veth deletes both; the bridge goes last
            _run("ip", "link", "del", n.split(":", 1)[1], check=False)
    for ns in namespaces:
        _run("ip", "netns", "del", ns, check=False)
    # links inside a deleted namespace vanish a moment later, not at once
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline and run_id in list_resources():
        for n in list_resources().get(run_id, []):
            if n.startswith("link:"):
                _run("ip", "link", "del", n.split(":", 1)[1], check=False)
        time.sleep(0.1)
    (STATE_DIR / f"{run_id}.json").unlink(missing_ok=True)


def cleanup_leftovers() -> list[str]:
    """Remove namespaces and links of earlier runs whose owner process is gone."""
    removed: list[str] = []
    for run_id, names in list_resources().items():
        if not _owner_alive(run_id):
            _remove_run(run_id, names)
            removed.extend(names)
    return removed


class EmulatedCluster:
    """``nodes`` namespaces on one bridge, each node's link shaped to ``bandwidth_bps``.

    Use as a context manager; :meth:`down` is idempotent and also runs from ``atexit``
    and on SIGINT/SIGTERM (the handler raises ``KeyboardInterrupt`` / ``SystemExit`` so
    that ``finally`` blocks of the caller run too).
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
        self.run_id = run_id or secrets.token_hex(2)
        self.latency_emulated = False
        self._up = False
        self._old_handlers: dict[int, Any] = {}

    # --- names (interface names are limited to 15 characters) ---
    def ns(self, i: int) -> str:
        return f"{PREFIX}-{self.run_id}-n{i}"

    def ifname(self, i: int) -> str:
        """The node-side veth of node ``i`` (GLOO_SOCKET_IFNAME inside its namespace)."""
        return f"{PREFIX}{self.run_id}n{i}"

    def _host_if(self, i: int) -> str:
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
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        (STATE_DIR / f"{self.run_id}.json").write_text(json.dumps({"pid": os.getpid()}))
        self._install_handlers()
        self._up = True  # from here on, down() has something to remove
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "up")
        prefix = self.net.prefixlen
        rate_bits = self.bandwidth_bps
        # tbf bucket: >= 1 ms at the rate (timer granularity) and >= 64 KiB (GSO packets)
        burst = max(int(rate_bits / 8 * 1e-3), 65536)
        netem_ok = self.latency_s > 0 and self._has_netem()
        if self.latency_s > 0 and not netem_ok:
            print(
                "warning: this kernel has no sch_netem, so the inter-node latency is not "
                "emulated (the link check records the measured one)",
                file=sys.stderr,
            )
        self.latency_emulated = netem_ok
        for i in range(self.nodes):
            ns, nif, hif = self.ns(i), self.ifname(i), self._host_if(i)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", hif, "type", "veth", "peer", "name", nif, "netns", ns)
            _run("ip", "link", "set", hif, "master", self.bridge, "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.addr(i)}/{prefix}", "dev", nif)
            _run("ip", "-n", ns, "link", "set", nif, "up")
            parent = ["root", "handle", "1:"]
            if netem_ok:
                delay_us = f"{self.latency_s * 1e6:.0f}us"
                _run(
                    "tc",
                    "-n",
                    ns,
                    "qdisc",
                    "add",
                    "dev",
                    nif,
                    "root",
                    "handle",
                    "1:",
                    "netem",
                    "delay",
                    delay_us,
                    "limit",
                    "100000",
                )
                parent = ["parent", "1:", "handle", "2:"]
            _run(
                "tc",
                "-n",
                ns,
                "qdisc",
                "add",
                "dev",
                nif,
                *parent,
                "tbf",
                "rate",
                f"{int(rate_bits)}bit",
                "burst",
                str(burst),
                "latency",
                "100ms",
            )

    def _has_netem(self) -> bool:
        """Whether ``tc ... netem`` works here (a probe on a throw-away dummy link)."""
        probe = f"{PREFIX}{self.run_id}h99"
        if _run("ip", "link", "add", probe, "type", "dummy", check=False).returncode != 0:
            return False
        try:
            r = _run(
                "tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms", check=False
            )
            return r.returncode == 0
        finally:
            _run("ip", "link", "del", probe, check=False)

    def down(self) -> None:
        """Remove every namespace, link and qdisc of this run (idempotent)."""
        if not self._up:
            return
        self._up = False
        try:
            _remove_run(self.run_id, list_resources().get(self.run_id, []))
        finally:
            self._restore_handlers()

    def _install_handlers(self) -> None:
        atexit.register(self.down)

        def handler(signum: int, frame: FrameType | None) -> None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old_handlers[sig] = signal.signal(sig, handler)
            except ValueError:  # not the main thread: rely on finally/atexit
                pass

    def _restore_handlers(self) -> None:
        atexit.unregister(self.down)
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old)
            except ValueError:
                pass
        self._old_handlers.clear()

    def __enter__(self) -> EmulatedCluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def describe(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "nodes": self.nodes,
            "bandwidth_bps": self.bandwidth_bps,
            "latency_s": self.latency_s,
            "latency_emulated": self.latency_emulated,
            "addresses": [self.addr(i) for i in range(self.nodes)],
        }


if __name__ == "__main__":  # python -m bench.cluster.netns [list|cleanup]
    cmd = sys.argv[1] if len(sys.argv) > 1 else "list"
    if cmd == "cleanup":
        print("\n".join(cleanup_leftovers()) or "nothing to remove")
    else:
        print(json.dumps(list_resources(), indent=1))
