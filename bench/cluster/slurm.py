"""A real Slurm cluster on one machine, for the sweeps' Slurm path: munged and slurmctld in
node 0's namespace of an emulated cluster (:mod:`bench.cluster.netns`), a slurmd in each
node's, so that jobs talk over the shaped link and the guardian kills the daemons with the
namespaces (docs/sweeps.md, "Trying the Slurm path on one machine")."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.cluster.netns import (
    PREFIX,
    EmulatedCluster,
    cleanup_leftovers,
    is_alive,
    owner_alive,
    read_state,
    require_tools,
    run_cmd,
    state_ids,
    update_state,
)
from bench.registry import ConfigError

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "nsenter")
PACKAGES = "apt-get install slurm-wlm munge"
PARTITION = "cpu"
CONF_ENV = "SLURM_CONF"
READY_S = 60.0  # how long the daemons get to come up and every node to be idle
SUBNET_BASE = "10.231"  # the cluster's /24 is the first 10.231.N.0 this machine does not use


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def require_slurm() -> None:
    require_tools()  # root, ip, tc
    if missing := missing_tools():
        raise ConfigError(
            f"a local Slurm cluster needs {', '.join(missing)} ({PACKAGES}); "
            "without them use --launcher submitit_local"
        )


def remove_stale_folders() -> None:
    for d in Path(tempfile.gettempdir()).glob(f"{PREFIX}-slurm-*"):
        if not owner_alive(d.name.rsplit("-", 1)[-1]):
            shutil.rmtree(d, ignore_errors=True)


def free_subnet() -> str:
    """A private /24 that no address or route of this machine uses."""
    used = run_cmd("ip", "-o", "-4", "addr", check=False).stdout
    used += run_cmd("ip", "-4", "route", check=False).stdout
    taken = {ipaddress.ip_interface(a).network for a in re.findall(r"\d+\.\d+\.\d+\.\d+/\d+", used)}
    for n in range(1, 255):
        net = ipaddress.ip_network(f"{SUBNET_BASE}.{n}.0/24")
        if not any(net.overlaps(t) for t in taken):
            return str(net)
    raise ConfigError(f"no free {SUBNET_BASE}.N.0/24 subnet on this machine")


def render_conf(
    folder: Path, addresses: list[str], cpus: int, mem_mb: int, partition: str, name: str
) -> str:
    """``slurm.conf`` of nodes ``node0..`` at ``addresses``, the controller at node 0's."""
    f = folder
    nodes = "\n".join(
        f"NodeName=node{i} NodeAddr={a} CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN"
        for i, a in enumerate(addresses)
    )
    return f"""\
ClusterName={name}
SlurmctldHost={socket.gethostname()}({addresses[0]})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={f}/munge.socket
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool-%n
SlurmctldPidFile={f}/slurmctld.pid
SlurmdPidFile={f}/slurmd-%n.pid
SlurmctldLogFile={f}/slurmctld.log
SlurmdLogFile={f}/slurmd-%n.log
PlugStackConfig={f}/plugstack.conf
TaskProlog={f}/task_prolog.sh
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=1
MinJobAge=3600
KillWait=30
SlurmdTimeout=30
InactiveLimit=0
DefMemPerCPU={max(1, mem_mb // cpus)}
{nodes}
PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


# each task's collectives bind the node's own interface (its namespace has one besides lo),
# and its launcher names the node by that interface's address (cluster.local_addr): every
# namespace has the host's name, which resolves to the loopback
TASK_PROLOG = """\
#!/bin/sh
dev=$(ip -o link show | awk -F': ' '$2 != "lo" {print $2}' | cut -d@ -f1 | head -n 1)
[ -n "$dev" ] && for v in GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME TP_SOCKET_IFNAME; do
  echo "export $v=$dev"; done
addr=$(ip -o -4 addr show dev "$dev" 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -n 1)
[ -n "$addr" ] && echo "export BENCH_LOCAL_ADDR=$addr"
exit 0
"""


class SlurmCluster:
    """munged, slurmctld and a slurmd per node; :meth:`down` is idempotent."""

    def __init__(
        self,
        nodes: int,
        bandwidth_bps: float,
        latency_s: float = 0.0,
        *,
        cpus: int = 0,
        mem_mb: int = 0,
        partition: str = PARTITION,
        keep_logs: Path | None = None,
    ) -> None:
        if not cpus:
            cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
        host_mb = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20
        self.cpus = cpus or os.cpu_count() or 1
        self.mem_mb = mem_mb or max(512, host_mb // (2 * max(1, nodes)))  # half for the nodes
        if self.cpus < 1 or self.mem_mb < 1:
            raise ConfigError(f"a Slurm node needs >= 1 CPU and memory, got {cpus}, {mem_mb}")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", partition):
            raise ConfigError(f"a partition name is a word, got {partition!r}")
        self.partition = partition
        self.keep_logs = keep_logs  # on down, the daemons' logs are copied under it
        self.nodes = nodes
        self._net_args = (nodes, bandwidth_bps, latency_s)
        self.net: EmulatedCluster | None = None
        self.folder = Path()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, CONF_ENV: str(self.conf)}

    def node_names(self) -> list[str]:
        return [f"node{i}" for i in range(self.nodes)]

    def plan(self) -> str:
        """What :meth:`up` would make (addresses and the folder are chosen then)."""
        nodes, bw, lat = self._net_args
        addrs = [f"<10.231.N.{i + 1}>" for i in range(nodes)]
        conf = render_conf(Path("<folder>"), addrs, self.cpus, self.mem_mb, self.partition,
                           f"{PREFIX}<id>")  # fmt: skip
        head = (f"# {nodes} node(s) on links of {bw / 1e6:g} Mbit/s (+{lat * 1e3:g} ms); "
                f"would write <folder>/slurm.conf, <folder> = "
                f"{tempfile.gettempdir()}/{PREFIX}-slurm-<id>:")  # fmt: skip
        return f"{head}\n{conf}"

    def up(self) -> SlurmCluster:
        require_slurm()
        cleanup_leftovers()
        remove_stale_folders()
        nodes, bw, lat = self._net_args
        self.net = EmulatedCluster(nodes, bw, lat, subnet=free_subnet())
        self.net.up()  # from here on, down() has something to remove
        try:
            self._start()
        except BaseException:
            self.down()
            raise
        return self

    def _start(self) -> None:
        net = self.net
        assert net is not None
        # the host reaches the controller over the bridge (sbatch, squeue, scontrol)
        bridge_addr = str(net.net.broadcast_address - 1)
        run_cmd("ip", "addr", "add", f"{bridge_addr}/{net.net.prefixlen}", "dev", net.bridge)
        self.folder = Path(tempfile.gettempdir()) / f"{PREFIX}-slurm-{net.run_id}"
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(mode=0o700)
        (self.folder / "state").mkdir()
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        (self.folder / "plugstack.conf").write_text("")
        prolog = self.folder / "task_prolog.sh"
        prolog.write_text(TASK_PROLOG)
        prolog.chmod(0o755)
        addrs = [net.addr(i) for i in range(self.nodes)]
        self.conf.write_text(
            render_conf(self.folder, addrs, self.cpus, self.mem_mb, self.partition,
                        f"{PREFIX}{net.run_id}")
        )  # fmt: skip
        update_state(net.run_id, slurm_folder=str(self.folder))
        f = self.folder
        self._daemon("munged", 0, ["munged", "-F", "-f", f"--socket={f}/munge.socket",
                     f"--key-file={key}", f"--pid-file={f}/munged.pid",
                     f"--log-file={f}/munged.log", f"--seed-file={f}/munged.seed"])  # fmt: skip
        self._wait_for(lambda: (f / "munge.socket").exists(), "munged", f / "munged.log")
        self._daemon("slurmctld", 0, ["slurmctld", "-D", "-i"])
        for i in range(self.nodes):
            self._daemon(f"slurmd-node{i}", i, ["slurmd", "-D", "-N", f"node{i}"])
        self._wait_for(self._all_idle, "every node to be idle", f / "slurmctld.log")
        update_state(net.run_id, slurm_pids={k: p.pid for k, p in self.procs.items()})

    def _daemon(self, name: str, node: int, argv: list[str]) -> None:
        """``argv`` in node ``node``'s namespace (``nsenter`` keeps this machine's /sys)."""
        assert self.net is not None
        ns = f"/run/netns/{self.net.ns(node)}"
        path = os.pathsep.join(
            [os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        )
        log = open(self.folder / f"{name}.out", "wb")  # noqa: SIM115  (the daemon's)
        with log:
            self.procs[name] = subprocess.Popen(
                ["nsenter", f"--net={ns}", *argv], env={**self.env(), "PATH": path},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def _wait_for(self, ready: Any, what: str, log: Path) -> None:
        deadline = time.monotonic() + READY_S
        while not ready():
            dead = [k for k, p in self.procs.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{dead[0]} exited" if dead else f"no {what} after {READY_S:.0f} s"
                out = self.folder / f"{dead[0]}.out" if dead else log
                raise RuntimeError(f"the local Slurm cluster did not start: {why}; {tail(out)}")
            time.sleep(0.2)

    def _all_idle(self) -> bool:
        p = subprocess.run(["sinfo", "--noheader", "--Node", "--format=%N %t"],
                           capture_output=True, text=True, env=self.env())  # fmt: skip
        states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
        return p.returncode == 0 and all(
            states.get(n, "").startswith(("idle", "mix", "alloc")) for n in self.node_names()
        )

    def down(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.procs.clear()
        if self.net is not None:
            self.net.down()  # kills what is left in the namespaces (job steps)
            self.net = None
        if self.folder != Path():
            if self.keep_logs is not None and self.folder.exists():
                dest = Path(self.keep_logs) / "slurm-logs" / self.folder.name
                dest.mkdir(parents=True, exist_ok=True)
                for log in [*self.folder.glob("*.log"), *self.folder.glob("*.out")]:
                    shutil.copy(log, dest / log.name)
            shutil.rmtree(self.folder, ignore_errors=True)

    __enter__ = up

    def __exit__(self, *exc: object) -> None:
        self.down()

    def describe(self) -> dict[str, Any]:
        assert self.net is not None
        return {
            **self.net.describe(),
            "slurm_conf": str(self.conf),
            "partition": self.partition,
            "node_names": self.node_names(),
            "cpus_per_node": self.cpus,
            "mem_mb_per_node": self.mem_mb,
            "pids": {k: p.pid for k, p in self.procs.items()},
        }


def tail(path: Path, n: int = 5) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return f"no log at {path}"
    return " | ".join(lines[-n:]) or f"{path} is empty"


def stop(run_id: str | None = None, timeout_s: float = 60.0) -> list[str]:
    """``slurm-down``: stop the live clusters' owners (or ``run_id``'s), then remove what dead
    owners left; the ids stopped."""
    states = {rid: read_state(rid) or {} for rid in state_ids()}
    clusters = {rid: st for rid, st in states.items() if st.get("slurm_up") and is_alive(st)}
    if run_id is not None:
        if run_id not in clusters:
            raise ConfigError(f"no local Slurm cluster {run_id}; running: {sorted(clusters)}")
        clusters = {run_id: clusters[run_id]}
    for state in clusters.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(state["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while any(is_alive(s) for s in clusters.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for state in clusters.values():
        if is_alive(state):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(state["pid"]), signal.SIGKILL)
    time.sleep(0.2)
    cleanup_leftovers()
    remove_stale_folders()
    return sorted(clusters)


def serve(cluster: SlurmCluster, out: Any = sys.stdout) -> None:
    """``slurm-up``: bring the cluster up, say how to use it, hold it until a signal or a
    crash."""
    with cluster:
        info = cluster.describe()
        update_state(info["run_id"], slurm_up=True)  # slurm-down may stop it
        print(f"export {CONF_ENV}={cluster.conf}", file=out, flush=True)
        print(
            f"# local Slurm cluster {info['run_id']}: {cluster.nodes} node(s) "
            f"{' '.join(info['node_names'])} at {' '.join(info['addresses'])}, partition "
            f"{cluster.partition}, {cluster.cpus} CPUs and {cluster.mem_mb} MiB each; "
            f"stop it with Ctrl-C or python -m reproduce cluster slurm-down",
            file=out,
            flush=True,
        )
        print(f"# {json.dumps(info)}", file=out, flush=True)
        while all(p.poll() is None for p in cluster.procs.values()):
            time.sleep(0.5)
        dead = next(k for k, p in cluster.procs.items() if p.poll() is not None)
        raise RuntimeError(f"{dead} exited; {tail(cluster.folder / f'{dead}.out')}")
