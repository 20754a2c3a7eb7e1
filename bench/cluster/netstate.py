"""Who owns which emulated cluster: run ids, state files, liveness, cleanup, the guardian.

Every resource of an emulated cluster is named after its run id (6 hex digits; see
:mod:`bench.cluster.netns`), and ``<STATE_DIR>/<id>.json`` names the run's owner: the
launcher's pid *and* its start time (field 22 of ``/proc/<pid>/stat``), so that a reused
pid is not mistaken for a live owner.  An id is claimed by creating its state file
exclusively, under a lock, after checking that no namespace or link carries it yet; so
two runs started at once never share an id, and a run only ever removes resources whose
owner is dead (or itself).

The guardian is a small process in a session of its own that holds the read end of a
pipe whose write end only the launcher has: when the launcher dies in any way (even
``kill -9``), the pipe reaches end-of-file and the guardian kills every process in the
run's namespaces and removes its namespaces, links and state file.  After a clean
teardown the state file is gone and the guardian just exits.

CLI::

    python -m bench.cluster list      # resources by run id, with their owners
    python -m bench.cluster cleanup   # remove those of runs whose owner is dead
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.registry import ConfigError

PREFIX = "tkb"
ID_HEX = 6  # run id length: "tkb" + 6 + "h" + 3 digits = 13 <= 15, Linux's interface name limit
# owners of live runs: <STATE_DIR>/<id>.json
STATE_DIR = Path(os.environ.get("BENCH_NETNS_STATE", "/run/tkb-netns"))
# ids of 4 hex digits are those of older versions, whose leftovers are still recognised
NS_RE = re.compile(rf"^{PREFIX}-([0-9a-f]{{4}}|[0-9a-f]{{{ID_HEX}}})-n\d+$")
LINK_RE = re.compile(rf"^{PREFIX}([0-9a-f]{{4}}|[0-9a-f]{{{ID_HEX}}})(?:br|h\d+|n\d+|i\d+)$")


def run_cmd(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {p.stderr.strip()}")
    return p


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot); None when it is gone or
    a zombie (a killed process not yet reaped by its parent is dead too)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of the whole line


def identity(pid: int | None = None) -> dict[str, int]:
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": start_time(pid) or 0}


def is_alive(who: dict[str, Any]) -> bool:
    """Whether the process ``{"pid", "start"}`` still runs (same pid *and* start time)."""
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


def owned_by_me(run_id: str) -> bool:
    state = read_state(run_id)
    return state is not None and is_alive(state) and int(state["pid"]) == os.getpid()


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Serialise id claims and cleanups of every run on this machine."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def list_resources() -> dict[str, list[str]]:
    """Every namespace and link named with the project prefix, by run id."""
    found: dict[str, list[str]] = {}
    for line in run_cmd("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = NS_RE.match(name)
        if m:
            found.setdefault(m.group(1), []).append(f"netns:{name}")
    for line in run_cmd("ip", "-o", "link", "show", check=False).stdout.splitlines():
        # "12: tkbab12cdh0@if11: <...>" -> tkbab12cdh0
        parts = line.split(":", 2)
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = LINK_RE.match(name)
        if m:
            found.setdefault(m.group(1), []).append(f"link:{name}")
    return found


def _kill_namespace_pids(namespaces: list[str]) -> None:
    for ns in namespaces:
        for pid in run_cmd("ip", "netns", "pids", ns, check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)


def remove_run(run_id: str, names: list[str] | None = None) -> None:
    """Kill what runs in the run's namespaces, delete its links and namespaces, wait until
    they are gone, then delete its state file.  The caller checks the ownership."""
    names = list_resources().get(run_id, []) if names is None else names
    namespaces = [n.split(":", 1)[1] for n in names if n.startswith("netns:")]
    _kill_namespace_pids(namespaces)
    for n in names:
        if n.startswith("link:"):  # deleting one end of a veth deletes both
            run_cmd("ip", "link", "del", n.split(":", 1)[1], check=False)
    for ns in namespaces:
        run_cmd("ip", "netns", "del", ns, check=False)
    # links inside a deleted namespace vanish a moment later, not at once
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        left = list_resources().get(run_id, [])
        if not left:
            break
        _kill_namespace_pids([n.split(":", 1)[1] for n in left if n.startswith("netns:")])
        for n in left:
            if n.startswith("link:"):
                run_cmd("ip", "link", "del", n.split(":", 1)[1], check=False)
        time.sleep(0.1)
    state_path(run_id).unlink(missing_ok=True)


def cleanup_leftovers() -> list[str]:
    """Remove the resources and state files of runs whose owner is gone; a live run's are
    never touched."""
    removed: list[str] = []
    with locked():
        found = list_resources()
        stale = {p.stem for p in STATE_DIR.glob("*.json")}
        for run_id in sorted(set(found) | stale):
            if not owner_alive(run_id):
                remove_run(run_id, found.get(run_id, []))
                removed.extend(found.get(run_id, []) or [f"state:{run_id}"])
    return removed


def claim(run_id: str | None = None, **info: Any) -> str:
    """A run id no namespace, link or state file uses, claimed for this process.

    A given ``run_id`` whose owner is alive is refused; leftovers of a dead owner under
    that id are removed first.
    """
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
    """Add ``fields`` to this process's own state file (atomically replaced)."""
    state = read_state(run_id) or {}
    tmp = state_path(run_id).with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({**state, **fields}))
    os.replace(tmp, state_path(run_id))


def start_guardian(run_id: str) -> int:
    """Start the guardian of ``run_id``; the returned fd is the pipe's write end, which this
    process keeps open for as long as the run lives (closing it ends the guardian)."""
    r, w = os.pipe()
    code = "from bench.cluster.netstate import guard; guard()"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, run_id],
        stdin=r,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the launcher's process group spares it
        env={**os.environ, "BENCH_NETNS_STATE": str(STATE_DIR), "PYTHONPATH": _pythonpath()},
    )
    os.close(r)
    update_state(run_id, guardian=identity(proc.pid))
    return w


def _pythonpath() -> str:
    """This package's root first, so that the guardian imports the same code."""
    root = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))


def guard() -> None:
    """The guardian (``sys.argv[1]`` is the run id): wait for the launcher's end, then
    remove whatever of the run it left behind."""
    run_id = sys.argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass  # end-of-file: the launcher closed the pipe or died
    with locked():
        state = read_state(run_id)
        if state is None or is_alive(state):
            return  # torn down already, or (never) a live owner
        remove_run(run_id)


def describe_all() -> dict[str, Any]:
    """``list`` of the CLI: resources by run id, with each run's owner and whether it lives."""
    found = list_resources()
    ids = set(found) | ({p.stem for p in STATE_DIR.glob("*.json")} if STATE_DIR.exists() else set())
    return {
        rid: {"owner": read_state(rid), "alive": owner_alive(rid), "resources": found.get(rid, [])}
        for rid in sorted(ids)
    }
