"""Nothing lost on a full disk, nothing hung on the emulated cluster: a sweep whose disk
fills up ends in one line and finishes, once there is room, with the tables an undisturbed
sweep writes; the emulated launcher's watchdog; checkpoint names that are not epochs; the
launcher's exit status against its record; values and paths that would fail in the workers
refused before launch; Hydra's launch folder."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
import zlib
from pathlib import Path

import pandas as pd
import pytest

from bench.results import records
from tests.conftest import REPO

HAVE_ROOT = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
PROBE = "tests.helpers.cluster_probe"  # run as a module: the repo root must be on the path
PROBE_ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _ns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


# 2. the emulated launcher: the local launcher's watchdog and bound


@pytest.mark.root
@pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)")
@pytest.mark.parametrize("victim", ["agent", "worker"])
def test_a_stopped_process_on_the_emulated_cluster_ends_the_run_within_the_bound(
    tmp_path: Path, victim: str
) -> None:
    from bench.cluster import netns
    from bench.cluster.emulated import run_nodes
    from bench.cluster.torchrun import MARGIN_S, STOPPED
    from bench.results.events import EVENTS_ENV, read_events

    stall, events, seen = 3.0, tmp_path / "events.jsonl", {}

    def stop_node_1(ns: str) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # node 1's agent and its worker
            pids = _ns_pids(ns)
            if len(pids) >= 2:
                break
            time.sleep(0.2)
        seen["pids"] = pids
        agent = min(pids)  # the agent starts its worker
        pid = agent if victim == "agent" else max(pids)
        time.sleep(2.0)  # the worker is past its start
        seen["pid"], seen["t"] = pid, time.monotonic()
        os.kill(pid, signal.SIGSTOP)

    with netns.EmulatedCluster(2, 1e9) as c:
        t = threading.Thread(target=stop_node_1, args=(c.ns(1),), daemon=True)
        t.start()
        rc = run_nodes(c, 1, PROBE, ["--out", str(tmp_path / "o"), "--sleep", "300"],
                       rdzv_timeout_s=120, env={**PROBE_ENV, EVENTS_ENV: str(events)},
                       stall_s=stall)  # fmt: skip
        took = time.monotonic() - seen["t"]
        run_id = c.run_id
    assert rc == 1 and took < stall + MARGIN_S, took
    (e,) = [e for e in read_events(events) if e.get("kind") == STOPPED]
    who = f"agent 1 (pid {seen['pid']})" if victim == "agent" else f"(pid {seen['pid']}) under"
    assert who in e["reason"] and "stopped responding" in e["reason"], e["reason"]
    assert not [p for p in seen["pids"] if _alive(p)]
    assert netns.list_resources().get(run_id, []) == []


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.skipif(not HAVE_ROOT, reason="needs root and iproute2 (ip, tc)")
def test_a_stopped_agent_ends_an_emulated_run_named_in_its_record(tmp_path: Path) -> None:
    from bench.cluster import netns
    from bench.cluster.torchrun import MARGIN_S
    from tests.test_fault_tolerance import _start, _workers

    timeout = 15
    proc = _start(
        tmp_path, "cluster=emulated", "cluster.nnodes=2", "cluster.nproc_per_node=1",
        "cluster.link_check=false", f"comm.timeout_s={timeout}", "train.epochs=200",
        "train.checkpoint_every=0",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "curves").is_dir():  # an epoch done: every process is up
            assert proc.poll() is None, proc.stdout.read()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no epoch in time"
            time.sleep(0.2)
        workers = _workers(tmp_path)
        stat = Path(f"/proc/{workers[-1]}/stat").read_text()
        agent = int(stat[stat.rindex(")") + 2 :].split()[1])
        os.kill(agent, signal.SIGSTOP)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=timeout + MARGIN_S + 60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    # the launcher's own record and the namespaces' removal, on a loaded machine: 15 s more
    assert took < timeout + MARGIN_S + 15, (took, out[-3000:])
    assert proc.returncode != 0
    (rec,) = records.load_records(tmp_path)
    assert rec["status"] == "error" and f"(pid {agent}) stopped responding" in rec["reason"]
    assert not _alive(agent) and not [p for p in workers if _alive(p)]
    assert not [r for r, st in netns.describe_all().items() if st["owner"] is None
                or st["owner"].get("pid") == proc.pid]  # fmt: skip


# 3. checkpoint names that are not epoch numbers


def test_checkpoint_files_of_other_names_are_ignored_by_resume_and_pruning(
    tmp_path: Path, monkeypatch
) -> None:
    import torch

    from bench.launch.run import prepare_resume
    from bench.train import checkpoint as ck
    from tests.test_robust import _fake_checkpoint

    d1 = _fake_checkpoint(tmp_path, "r1", epoch=1)
    _fake_checkpoint(tmp_path, "r1", epoch=2)
    copy = d1.parent / "epoch-0001 (copy).json"  # a copy, a sync conflict
    shutil.copy(d1.with_suffix(".json"), copy)
    shutil.copytree(d1, d1.parent / "epoch-0001 (copy)")
    records.append_record(tmp_path, {"run_id": "r1", "status": "interrupted"})
    with pytest.warns(UserWarning, match=r"epoch-0001 \(copy\)\.json is not a checkpoint"):
        _, meta, path = prepare_resume("r1", [f"results.dir={tmp_path}"], dry=True)
    assert path.endswith("epoch-0002") and meta["attempt"] == 2
    # pruning (keep 1) drops epoch 1, keeps the stranger and its folder
    cfg = _config_of(tmp_path, "train.keep_checkpoints=1")
    progress = type("P", (), {"state_dict": lambda self: {
        "epoch": 3, "step": 3, "train_time_s": 1.0, "status": "running", "curve": [],
        "evals": None}})()  # fmt: skip
    m = ck.CheckpointManager(cfg, meta, rank=0, world=1, device=torch.device("cpu"), states={},
                             progress=progress)  # fmt: skip
    with pytest.warns(UserWarning, match="not a checkpoint"):
        m.save(barrier=lambda: None)
    left = sorted(p.name for p in d1.parent.iterdir())
    assert left == ["epoch-0001 (copy)", "epoch-0001 (copy).json", "epoch-0003", "epoch-0003.json"]


def _config_of(results: Path, *overrides: str):
    from tests.conftest import TINY
    from tests.test_faults import _config

    return _config(results, *TINY, *overrides)


# 4. the launcher's exit status and message agree with the record


def test_a_process_stopped_after_the_record_does_not_fail_the_run(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from bench.cluster.torchrun import STOPPED
    from bench.launch import run
    from bench.results import events as ev

    cfg = _config_of(tmp_path)
    meta = {"run_id": "20261203-000000-abcdef", "started_at": "x", "launch_time": time.time(),
            "experiment": "e"}  # fmt: skip

    def workers_then_watchdog(c, run_json):  # the workers recorded it; an agent hung after
        records.append_record(tmp_path, {"run_id": meta["run_id"], "status": "target_missed"})
        log = ev.events_path(tmp_path, meta["run_id"])
        ev.log_event(log, kind=STOPPED, reason="agent 0 (pid 12) stopped responding; the "
                     "run was ended")  # fmt: skip
        return 1, "error", None, None

    monkeypatch.setattr(run, "guarded_launch", workers_then_watchdog)
    rc, rec = run.launch_and_record(cfg, meta, tmp_path / "launch")
    err = capsys.readouterr().err
    assert rc == 0 and rec["status"] == "target_missed"
    assert "error" not in err and "note: agent 0 (pid 12) stopped responding" in err, err
    assert "after the workers recorded the run (target_missed)" in err


# 5. values the workers would fail on, refused before launch


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("data.image_size=8192", "GiB of memory"),
        ("data.image_size=4", "model=resnet9 cannot take 4 x 4 images"),
        ("comm.timeout_s=0.001", "comm.timeout_s=0.001 is shorter than"),
    ],
)
def test_values_that_only_fail_in_the_workers_are_refused_in_one_line(
    tmp_path: Path, capsys, override: str, says: str
) -> None:
    from reproduce.__main__ import main
    from tests.test_robust import _one_line_exit

    line = _one_line_exit(capsys, main, "train", "--dry-run", f"results.dir={tmp_path}", override)
    assert says in line, line
    line = _one_line_exit(capsys, main, "train", f"results.dir={tmp_path / 'r'}", override)
    assert says in line and not list(tmp_path.iterdir()), line  # nothing made


# 6, 7. paths given the Hydra way; Hydra's launch folder


@pytest.mark.parametrize("form", ["override", "flag"])
@pytest.mark.parametrize("name", ["sü ß", "cost${x}", "a,b 'q'"])
def test_any_results_path_runs_with_its_launch_folder_and_no_empty_log(
    tmp_path: Path, monkeypatch, form: str, name: str
) -> None:
    from bench.launch import run
    from reproduce.__main__ import main

    seen = []
    monkeypatch.setattr(run, "launch_and_record", lambda cfg, meta, out: seen.append(
        (cfg, out)) or (0, None))  # fmt: skip
    weird = tmp_path / name
    where = [f"results.dir={weird}"] if form == "override" else ["--results-dir", str(weird)]
    main(["train", *where])
    ((cfg, out),) = seen
    assert cfg.results.dir == str(weird) and Path(out).parent.parent == weird / "hydra"
    assert (Path(out) / ".hydra" / "config.yaml").is_file()
    assert not list(Path(out).glob("*.log"))  # no log promised, none left empty
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_refused_path_leaves_nothing_behind(tmp_path: Path, capsys) -> None:
    from reproduce.__main__ import main
    from tests.test_robust import _one_line_exit

    (tmp_path / "file").write_text("")
    line = _one_line_exit(capsys, main, "train", f"results.dir={tmp_path}/file/sü")
    assert "is not a directory" in line, line
    line = _one_line_exit(capsys, main, "train", "-m", f"results.dir={tmp_path}/c${{x}}",
                          "train.seed=1,2")  # fmt: skip
    assert "holds '${'" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


# 1. a full disk during a sweep


def _fake_record(run_id: str, kv: dict[str, str]) -> dict:
    """What a protocol job's workers would record, the same for the same job: its steps
    and step time by (method, trial)."""
    comm, trial, role = kv["comm"], kv["results.protocol_trial"], kv["results.protocol_role"]
    h = zlib.crc32(f"{comm} {trial}".encode())
    steps, step_s, epochs = 20 + h % 13, 0.1 + (h % 7) / 100, int(kv.get("train.epochs", 3))
    per = int(kv.get("train.max_steps_per_epoch", 0))
    return {
        "run_id": run_id, "status": "ok", "experiment": "dawnbench_digits", "comm": comm,
        "comm_density": float(kv.get("comm.density", 1.0)), "comm_warmup_epochs": 0,
        "cache": "none", "update": "foreach", "world_size": 4, "nnodes": 2,
        "target_metric": "top1", "target_value": 0.98, "time_to_target_s": steps * step_s,
        "steps_to_target": steps, "train_time_s": epochs * (per or 11) * step_s,
        "step_time_s": step_s, "epochs_run": epochs,
        "config": {
            "experiment": "dawnbench_digits", "comm": {"name": comm},
            "cluster": {"name": kv["cluster"], "nnodes": 2, "nproc_per_node": 2},
            "train": {"seed": int(kv["train.seed"]), "max_steps_per_epoch": per},
            "results": {"sweep_id": kv["results.sweep_id"]},
        },
        "protocol": {"name": kv["results.protocol"], "role": role, "trial": trial,
                     "selected": kv["results.protocol_selected"] == "true"},
    }  # fmt: skip


def _queue(ran: list[str], disk: dict[str, int]):
    """A run queue whose jobs record :func:`_fake_record`; while ``disk["errors"]`` counts
    down, the tuning runs' workers end in ``error`` (their disk is full), and at 0 the
    queue's own launch file does not fit (``disk["full"]``)."""
    import errno

    def run_queued(jobs: list[list[str]], sweep_dir: Path, experiment: str) -> list[int]:
        rcs = []
        for job in jobs:
            kv = dict(o.split("=", 1) for o in job if "=" in o)
            rid = f"20261203-000000-{len(ran):06x}"  # a run id's form
            full = disk["full"] and kv["results.protocol_role"] == "tune"
            if full and disk["errors"] == 0:
                launch = Path(sweep_dir) / f"run-{rid}.json"
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(launch))
            ran.append(rid)
            rec = _fake_record(rid, kv)
            if full:
                disk["errors"] -= 1
                rec.update(status="error", time_to_target_s=None, steps_to_target=None,
                           reason="no space left on device")  # fmt: skip
            else:
                curve = [{"epoch": e, "clock/train_s": e * 11 * rec["step_time_s"],
                          "acc/top1": 0.5 + 0.16 * e, "data/steps": 11}
                         for e in range(1, rec["epochs_run"] + 1)]  # fmt: skip
                path = records.curve_path(kv["results.dir"], rid)
                path.parent.mkdir(parents=True, exist_ok=True)
                pd.DataFrame(curve).to_csv(path, index=False)
            records.append_record(kv["results.dir"], rec)
            rcs.append(0 if rec["status"] == "ok" else 1)
        return rcs

    return run_queued


def _tables(results: Path, sweep_id: str) -> dict[str, pd.DataFrame]:
    """The sweep's finished tables, without what names its runs (ids differ)."""
    out = {}
    for name in (f"{sweep_id}-tuning.csv", f"{sweep_id}.csv"):
        df = pd.read_csv(results / "ablation" / name)
        out[name.replace(sweep_id, "S")] = df.drop(columns=["sweep_id", "run_ids"])
    return out


def test_a_full_disk_sweep_finishes_with_the_tables_of_an_undisturbed_one(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from bench.sweeps import common
    from bench.sweeps import protocol as pr
    from bench.sweeps.resume import RERUN_FAILED
    from reproduce import ablation

    monkeypatch.setattr(common, "pin_profile", lambda job: ([], ""))  # no timing of this host
    quick = ["--quick", "--order-seed", "7"]
    ran: list[str] = []
    monkeypatch.setattr(common, "run_queued", _queue(ran, {"full": 0, "errors": 0}))
    ablation.main([*quick, "--sweep-id", "s0", "--results-dir", str(tmp_path / "calm")])
    capsys.readouterr()

    disk = {"full": 1, "errors": 3}  # 3 tuning runs fail, then the sweep's own write
    monkeypatch.setattr(common, "run_queued", _queue(ran, disk))
    res = tmp_path / "full"
    with pytest.raises(SystemExit) as e:
        ablation.main([*quick, "--sweep-id", "s1", "--results-dir", str(res)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1, err
    assert err[0].startswith(f"error: no space left on device writing {res}/hydra/"), err
    assert " at /" in err[0] and "free" in err[0]  # its disk: mount point, space
    assert err[0].endswith(f"--resume s1 --results-dir {res} --rerun-failed"), err
    assert not list(res.rglob("*.tmp")) and not list((res / "ablation").glob("*.csv"))

    disk["full"] = 0  # room again; the failed runs stay failed without --rerun-failed
    with pytest.raises(SystemExit) as e:
        ablation.main(["--resume", "s1", "--results-dir", str(res)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1 and "3 ended in error" in err[0], err
    assert "no configuration was selected" in err[0] and "--rerun-failed" in err[0]
    assert not list((res / "ablation").glob("*.csv"))  # nothing from incomplete data
    assert (res / "ablation" / "partial" / "s1-tuning.csv").is_file()

    ablation.main(["--resume", "s1", "--rerun-failed", "--results-dir", str(res)])
    assert not list((res / "ablation" / "partial").glob("*.csv"))
    calm, full = _tables(tmp_path / "calm", "s0"), _tables(res, "s1")
    for name, df in calm.items():
        pd.testing.assert_frame_equal(full[name], df)  # the same selections and times
    plan = pr.Plan.load(res, "s1")
    recs = common.sweep_records(res, "s1")
    jobs = [*plan.tune_jobs(), *plan.timing_jobs(), *plan.eval_jobs(pr.chosen(plan, recs))]
    assert pr.pending(jobs, recs, RERUN_FAILED) == []  # every run accounted for
    done, n = {p: p.read_bytes() for p in (res / "ablation").glob("*.csv")}, len(ran)
    ablation.main(["--resume", "s1", "--rerun-failed", "--results-dir", str(res)])
    assert len(ran) == n and {p: p.read_bytes() for p in done} == done  # finished: kept


def test_a_launcher_that_meets_a_full_disk_records_the_file_and_its_disk(
    tmp_path: Path, monkeypatch
) -> None:
    import errno

    from bench.launch import run

    def full(cfg, run_json):  # the launcher's own write (the link check's file, say)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "link_check.json"))

    monkeypatch.setattr(run, "launch_workers", full)
    rc, status, reason, raised = run.guarded_launch(_config_of(tmp_path), tmp_path / "r.json")
    assert rc == 1 and status == "error" and isinstance(raised, OSError)
    assert reason.startswith(f"no space left on device writing {tmp_path}/link_check.json (")


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 256 KiB tmpfs, unmounted afterwards."""
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs: needs root")
def test_the_sweeps_own_write_on_a_full_disk_is_one_line_and_leaves_no_file(
    small_disk: Path, monkeypatch, capsys
) -> None:
    from bench.launch.run import write_run_json
    from bench.sweeps import common
    from reproduce import ablation

    monkeypatch.setattr(common, "pin_profile", lambda job: ([], ""))

    def fill_then_launch(jobs: list[list[str]], sweep_dir: Path, experiment: str) -> list[int]:
        fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT)  # another program
        try:  # fills the disk
            while os.write(fd, bytes(4096)):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        payload = {"config": {"cluster": {"name": "local"}, "jobs": jobs}, "run": {"run_id": "r"}}
        write_run_json(Path(sweep_dir), payload)  # a run's launch file, as the queue writes
        return [0] * len(jobs)

    monkeypatch.setattr(common, "run_queued", fill_then_launch)
    with pytest.raises(SystemExit) as e:
        ablation.main(["--quick", "--sweep-id", "s1", "--results-dir", str(small_disk)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1, err
    run_json = small_disk / "hydra" / "ablation" / "s1" / "tune" / "run-r.json"
    assert err[0].startswith(f"error: no space left on device writing {run_json} (tmpfs at "
                             f"{small_disk}, "), err  # fmt: skip
    assert not list(small_disk.rglob("*.tmp")) and not run_json.exists()
