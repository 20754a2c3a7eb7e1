"""A cluster emulated on one Linux machine: a network namespace per node on a bridge, each
node's veth shaped both ways with ``tc tbf`` (plus ``netem`` latency where the kernel has
it); run ids, owners and a guardian process make cleanup safe (docs/internals/cluster.md)."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
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
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from bench.registry import ConfigError
from bench.results import whole

PREFIX = "tkb"
ID_HEX = 6  # run id length: "tkb" + 6 + "h" + 3 digits = 13 <= 15, Linux's interface name limit
STATE_DIR = Path(os.environ.get("BENCH_NETNS_STATE", "/run/tkb-netns"))  # <id>.json: owners
NS_RE = re.compile(rf"^{PREFIX}-([0-9a-f]{{{ID_HEX}}})-n\d+$")
LINK_RE = re.compile(rf"^{PREFIX}([0-9a-f]{{{ID_HEX}}})(?:br|h\d+|n\d+|i\d+)$")


def run_cmd(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {p.stderr.strip()}")
    return p


def proc_stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after ``pid (comm)``; None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """Clock ticks since boot; None when gone or a zombie."""
    fields = proc_stat(pid)
    return None if fields is None or fields[0] in ("Z", "X") else int(fields[19])


def identity(pid: int | None = None) -> dict[str, int]:
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": start_time(pid) or 0}


def is_alive(who: dict[str, Any]) -> bool:
    """Whether ``{"pid", "start"}`` still runs (same pid *and* start time)."""
    try:
        pid = int(who["pid"])
    except (KeyError, TypeError, ValueError):
        return False
    st = start_time(pid)
    return st is not None and ("start" not in who or int(who["start"]) == st)


def state_path(run_id: str) -> Path:
    return STATE_DIR / f"{run_id}.json"


def read_state(run_id: str) -> dict[str, Any] | None:
    try:
        return json.loads(state_path(run_id).read_text())
    except (OSError, ValueError):
        return None


def owner_alive(run_id: str) -> bool:
    state = read_state(run_id)
    return state is not None and is_alive(state)


def state_ids() -> set[str]:
    return {p.stem for p in STATE_DIR.glob("*.json")} if STATE_DIR.exists() else set()


@contextlib.contextmanager
def locked() -> Iterator[None]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def list_resources() -> dict[str, list[str]]:
    """Every namespace and link named with the project prefix, by run id."""
    found: dict[str, list[str]] = {}
    for line in run_cmd("ip", "netns", "list", check=False).stdout.splitlines():
        m = NS_RE.match(line.split()[0] if line.strip() else "")
        if m:
            found.setdefault(m.group(1), []).append(f"netns:{m.group(0)}")
    for line in run_cmd("ip", "-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":", 2)  # "12: tkbab12cdh0@if11: <...>" -> tkbab12cdh0
        m = LINK_RE.match(parts[1].strip().split("@")[0]) if len(parts) > 1 else None
        if m:
            found.setdefault(m.group(1), []).append(f"link:{m.group(0)}")
    return found


def remove_run(run_id: str, names: list[str] | None = None) -> None:
    """Kill, delete and wait out the run's namespaces, links and state (ownership unchecked)."""
    names = list_resources().get(run_id, []) if names is None else names
    deadline = time.monotonic() + 15.0
    while names and time.monotonic() < deadline:
        for kind, name in (n.split(":", 1) for n in names):
            if kind == "netns":
                for pid in run_cmd("ip", "netns", "pids", name, check=False).stdout.split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
        # links first (deleting one end of a veth deletes both), then the namespaces
        for kind, name in sorted(n.split(":", 1) for n in names):
            run_cmd("ip", "link" if kind == "link" else "netns", "del", name, check=False)
        time.sleep(0.1)  # links inside a deleted namespace vanish a moment later, not at once
        names = list_resources().get(run_id, [])
    state_path(run_id).unlink(missing_ok=True)


def cleanup_leftovers() -> list[str]:
    removed: list[str] = []
    with locked():
        found = list_resources()
        for run_id in sorted(set(found) | state_ids()):
            if not owner_alive(run_id):
                remove_run(run_id, found.get(run_id, []))
                removed.extend(found.get(run_id, []) or [f"state:{run_id}"])
    return removed


def claim(run_id: str | None = None, **info: Any) -> str:
    """A run id nothing uses, claimed for this process (a given id of a live owner refused,
    a dead owner's leftovers under it removed)."""
    with locked():
        found = list_resources()
        for _ in range(1000):
            rid = run_id or secrets.token_hex(ID_HEX // 2)
            if owner_alive(rid):
                if run_id:
                    raise ConfigError(
                        f"the emulated cluster id {rid} belongs to the live run of pid "
                        f"{read_state(rid)['pid']}; choose another id"  # type: ignore[index]
                    )
                continue
            if rid in found or state_path(rid).exists():  # a dead owner's leftovers
                if not run_id:
                    continue  # a fresh random id is cheaper than a cleanup
                remove_run(rid, found.get(rid, []))
            fd = os.open(state_path(rid), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "w") as f:
                json.dump({**identity(), **info}, f)
            return rid
    raise RuntimeError("no free emulated cluster id after 1000 tries")


def update_state(run_id: str, **fields: Any) -> None:
    whole.write(state_path(run_id), json.dumps({**(read_state(run_id) or {}), **fields}))


def start_guardian(run_id: str) -> int:
    """Start :func:`guard`; the returned pipe end is held open as long as the run lives."""
    r, w = os.pipe()
    env = {**os.environ, "BENCH_NETNS_STATE": str(STATE_DIR)}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from bench.cluster.netns import guard; guard()", run_id],
        stdin=r,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the launcher's process group spares it
        env=env,
    )
    os.close(r)
    update_state(run_id, guardian=identity(proc.pid))
    return w


OWNER_EXIT_WAIT_S = 5.0  # how long the guardian waits for a closed pipe's owner to be gone


def guard() -> None:
    """The guardian of run ``sys.argv[1]``: once the launcher ends, remove what it left."""
    run_id = sys.argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass  # end-of-file: the launcher closed the pipe or died
    # a killed launcher's pipe closes while the kernel still tears the process down, before
    # /proc shows it dead: wait for that, or the run would be taken for a live one and kept
    deadline = time.monotonic() + OWNER_EXIT_WAIT_S
    while owner_alive(run_id) and time.monotonic() < deadline:
        time.sleep(0.02)
    with locked():
        if read_state(run_id) is not None and not owner_alive(run_id):
            remove_run(run_id)  # else torn down already, or (never) a live owner


def describe_all() -> dict[str, Any]:
    found = list_resources()
    return {
        rid: {"owner": read_state(rid), "alive": owner_alive(rid), "resources": found.get(rid, [])}
        for rid in sorted(set(found) | state_ids())
    }


FRAME = 1514  # bytes of a full Ethernet frame (MTU 1500), as tbf counts them
BURST_FRAMES, BURST_S = 4, 20e-6  # token bucket: max(4 frames, 20 us at the rate)
QUEUE_MIN, QUEUE_S = 65536, 2e-3  # queue behind it: max(64 KiB, 2 ms at the rate)
_BW_UNITS = {  # bits per second; tc's spelling (kbit, mbit, gbit) plus the usual "Gbps"
    prefix + unit: scale
    for unit in ("bit", "bps")
    for prefix, scale in {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}.items()
}
_LAT_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}
_NUMBER_UNIT = r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]+)\s*"


def parse_bandwidth(text: str) -> float:
    """``"1gbit"``, ``"25Gbps"`` -> bits per second."""
    m = re.fullmatch(_NUMBER_UNIT, str(text).lower())
    if not m or m.group(2) not in _BW_UNITS or float(m.group(1)) <= 0:
        raise ConfigError(
            f"cannot parse the bandwidth {text!r}; write a positive number and a unit, "
            "e.g. 100mbit, 1gbit, 25gbit"
        )
    return float(m.group(1)) * _BW_UNITS[m.group(2)]


def parse_latency(text: str) -> float:
    """``"0.2ms"``, ``"0"`` -> seconds."""
    if str(text).strip() in ("0", "0.0", ""):
        return 0.0
    m = re.fullmatch(_NUMBER_UNIT, str(text).lower())
    if not m or m.group(2) not in _LAT_UNITS:
        raise ConfigError(
            f"cannot parse the latency {text!r}; write a number and a unit, e.g. 0.2ms, 50us"
        )
    return float(m.group(1)) * _LAT_UNITS[m.group(2)]


def require_tools() -> None:
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


def link_counters() -> tuple[int, int]:
    """Bytes sent and received by this namespace's non-loopback interfaces (in an emulated
    node, its one link), frames whole."""
    tx = rx = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, rest = line.split(":", 1)
            if name.strip() != "lo":
                fields = rest.split()
                rx, tx = rx + int(fields[0]), tx + int(fields[8])
    return tx, rx


def shaping(rate_bps: float) -> tuple[int, int]:
    """tbf's ``burst`` and ``limit`` (bytes): a few frames and a switch port's queue."""
    burst = max(BURST_FRAMES * FRAME, int(rate_bps / 8 * BURST_S))
    queue = max(QUEUE_MIN, int(rate_bps / 8 * QUEUE_S))
    return burst, burst + queue


class EmulatedCluster:
    """``nodes`` namespaces on one bridge, links shaped to ``bandwidth_bps``; :meth:`down` is
    idempotent and also runs at exit and on signals."""

    def __init__(
        self,
        nodes: int,
        bandwidth_bps: float,
        latency_s: float = 0.0,
        subnet: str = "10.213.0.0/24",
        run_id: str | None = None,
    ) -> None:
        if not 1 <= nodes <= 999:
            raise ConfigError(f"an emulated cluster has 1 to 999 nodes, got {nodes}")
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
        self.nodes, self.bandwidth_bps, self.latency_s = nodes, bandwidth_bps, latency_s
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
        return ["ip", "netns", "exec", self.ns(i), *argv]

    # --- life cycle ---
    def up(self) -> EmulatedCluster:
        require_tools()
        cleanup_leftovers()
        self.run_id = claim(self._wanted_id, nodes=self.nodes)
        atexit.register(self.down)

        def handler(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError):  # not the main thread: finally/atexit
                self._old_handlers[sig] = signal.signal(sig, handler)
        self._up = True  # from here on, down() has something to remove
        try:
            self._guardian_fd = start_guardian(self.run_id)
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        run_cmd("ip", "link", "add", self.bridge, "type", "bridge")
        run_cmd("ip", "link", "set", self.bridge, "addrgenmode", "none")  # no IPv6 address
        run_cmd("ip", "link", "set", self.bridge, "up")
        self.latency_emulated = self.latency_s > 0 and self._has_netem()
        if self.latency_s > 0 and not self.latency_emulated:
            print(
                "warning: this kernel has no sch_netem, so the inter-node latency is not "
                "emulated (the link check records the measured one)",
                file=sys.stderr,
            )
        for i in range(self.nodes):
            ns, nif, hif = self.ns(i), self.ifname(i), self.host_if(i)
            inside = ["ip", "-n", ns]
            run_cmd("ip", "netns", "add", ns)
            run_cmd("ip", "link", "add", hif, "type", "veth", "peer", "name", nif, "netns", ns)
            run_cmd("ip", "link", "set", hif, "addrgenmode", "none")
            run_cmd("ip", "link", "set", hif, "master", self.bridge, "up")
            run_cmd(*inside, "link", "set", "lo", "up")
            run_cmd(*inside, "link", "set", nif, "addrgenmode", "none")
            run_cmd(*inside, "addr", "add", f"{self.addr(i)}/{self.net.prefixlen}", "dev", nif)
            run_cmd(*inside, "link", "set", nif, "up")
            parent = ["root", "handle", "1:"]
            if self.latency_emulated:
                delay = f"{self.latency_s * 1e6:.0f}us"
                tc = ["tc", "-n", ns, "qdisc", "add", "dev", nif, "root", "handle", "1:"]
                run_cmd(*tc, "netem", "delay", delay, "limit", "100000")
                parent = ["parent", "1:", "handle", "2:"]
            self._tbf(["tc", "-n", ns], nif, parent)  # what node i sends
            self._tbf(["tc"], hif, ["root", "handle", "1:"])  # what node i receives

    def _tbf(self, tc: list[str], dev: str, parent: list[str]) -> None:
        burst, limit = shaping(self.bandwidth_bps)
        rate = f"{int(self.bandwidth_bps)}bit"
        run_cmd(*tc, "qdisc", "add", "dev", dev, *parent, "tbf", "rate", rate,
             "burst", str(burst), "limit", str(limit))  # fmt: skip

    def _has_netem(self) -> bool:
        """Whether ``tc ... netem`` works here (a throw-away veth pair)."""
        probe, peer = f"{PREFIX}{self.run_id}h998", f"{PREFIX}{self.run_id}h999"
        if run_cmd("ip", "link", "add", probe, "type", "veth", "peer", "name", peer,
                check=False).returncode != 0:  # fmt: skip
            return False
        try:
            tc = ["tc", "qdisc", "add", "dev", probe, "root"]
            return run_cmd(*tc, "netem", "delay", "1ms", check=False).returncode == 0
        finally:
            run_cmd("ip", "link", "del", probe, check=False)

    def down(self) -> None:
        """Remove this run's namespaces, links and qdiscs (never another's)."""
        if not self._up:
            return
        self._up = False
        try:
            state = read_state(self.run_id)
            if state is not None and is_alive(state) and int(state["pid"]) == os.getpid():
                remove_run(self.run_id)
        finally:
            if self._guardian_fd is not None:
                os.close(self._guardian_fd)  # the guardian finds nothing left and exits
                self._guardian_fd = None
            self._restore_handlers()

    def _restore_handlers(self) -> None:
        atexit.unregister(self.down)
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError):
                signal.signal(sig, old)
        self._old_handlers.clear()

    __enter__ = up

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
