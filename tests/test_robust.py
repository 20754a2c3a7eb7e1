"""Nothing lost, nothing hung: lines of ``runs.jsonl`` that are not records, agents and
workers that stop responding, sweeps that failed on a full disk, concurrent resumes, paths
and values the run would fail on, and the smaller rules of a run's files."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from bench.results import records
from bench.train import checkpoint as ck
from tests.conftest import REPO, TINY
from tests.test_figures import _curve, _record
from tests.test_figures import results as results  # noqa: F401  (the fixture)

BAD_LINES = [
    b'{"run_id": "caf\xe9", "status": "ok"}\n',  # a latin-1 byte
    b'{"note": "merged by hand"}\n',  # JSON, not a record
    b"[1, 2]\n",
]


def _spoil(path: Path) -> None:
    """Put the lines that are not records in the middle of ``path``."""
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:1] + BAD_LINES + lines[1:]))


# 1. readers of runs.jsonl skip lines that are not records; the writer appends


def test_readers_skip_lines_that_are_not_records_naming_file_and_line(tmp_path: Path) -> None:
    records.append_record(tmp_path, {"run_id": "a", "status": "ok"})
    records.append_record(tmp_path, {"run_id": "b", "status": "ok"})
    runs = records.runs_path(tmp_path)
    _spoil(runs)
    with pytest.warns(UserWarning) as caught:
        got = records.load_records(tmp_path)
    assert [r["run_id"] for r in got] == ["a", "b"]
    text = [str(w.message) for w in caught]
    for n, why in ((2, "not UTF-8"), (3, "no run_id"), (4, "not an object")):
        assert any(t.startswith(f"{runs}:{n}: skipped") and why in t for t in text), text
    # the writer appends after them, and keeps every line it found
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records.append_record(tmp_path, {"run_id": "c", "status": "error"})
        assert [r["run_id"] for r in records.load_records(tmp_path)] == ["a", "b", "c"]
    assert all(line in runs.read_bytes() for line in BAD_LINES)


def test_figures_and_compare_survive_lines_that_are_not_records(
    results: Path,  # noqa: F811
    tmp_path: Path,
    capsys,
) -> None:
    from reproduce import compare, figures

    _spoil(results / "runs.jsonl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        figures.main(["--results-dir", str(results), "--dry-run"])
        compare.main(["r-dense-0", "r-hitopk-0", "--results-dir", str(results),
                      "--out", str(tmp_path / "c.png"), "--dry-run"])  # fmt: skip
    out = capsys.readouterr().out
    assert "r-hitopk-0" in out and "nothing written" in out


def _fake_checkpoint(results: Path, run_id: str, epoch: int = 1, **config) -> Path:
    """A whole (tiny) checkpoint of ``run_id`` with the default config."""
    from hydra import compose, initialize_config_dir

    from bench.config import hydra_value, register_configs, to_container, to_object

    register_configs()
    overrides = [f"results.dir={hydra_value(str(results))}", *TINY]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = to_object(compose(config_name="config", overrides=overrides + [
            f"{k}={v}" for k, v in config.items()]))  # fmt: skip

    d = ck.run_dir(results, run_id) / f"epoch-{epoch:04d}"
    d.mkdir(parents=True)
    torch.save({}, d / "common.pt")
    for r in range(cfg.cluster.nnodes * cfg.cluster.nproc_per_node):
        torch.save({}, d / f"rank{r}.pt")
    run = {"run_id": run_id, "started_at": "x", "launch_time": time.time(), "experiment": "e"}
    manifest = {
        "config": to_container(cfg), "epoch": epoch, "step": 1,
        "world_size": cfg.cluster.nnodes * cfg.cluster.nproc_per_node,
        "train_time_s": 1.0, "curve": [], "status": "running", "run": run,
        "saved_at": time.time(), "files": ck.shard_sizes(d), "evals": None,
    }  # fmt: skip
    d.with_suffix(".json").write_text(json.dumps(manifest))
    return d


def test_a_resume_reads_past_lines_that_are_not_records(tmp_path: Path) -> None:
    from bench.launch.run import prepare_resume

    _fake_checkpoint(tmp_path, "r1")
    records.append_record(tmp_path, {"run_id": "r1", "status": "interrupted"})
    _spoil(records.runs_path(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg, meta, _ = prepare_resume("r1", [f"results.dir={tmp_path}"], dry=True)
    assert meta["attempt"] == 2


# 2. the launcher waits on all agents at once; a stopped process ends the run


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _spawn(*cmd: str) -> subprocess.Popen:
    return subprocess.Popen(list(cmd), start_new_session=True)


def test_the_launcher_waits_on_every_agent_at_once(monkeypatch) -> None:
    from bench.cluster import torchrun

    monkeypatch.setattr(torchrun, "GRACE_S", 2.0)
    slow, failed = _spawn("sleep", "60"), _spawn(sys.executable, "-c", "raise SystemExit(3)")
    t0 = time.monotonic()
    assert torchrun.wait_all([slow, failed], timeout_s=60, poll_s=0.1) == 3
    assert time.monotonic() - t0 < 10 and not _alive(slow.pid)


def test_a_stopped_worker_ends_the_run_named_and_nothing_is_left(monkeypatch, tmp_path) -> None:
    from bench.cluster import torchrun
    from bench.results.events import read_events

    monkeypatch.setattr(torchrun, "GRACE_S", 1.0)
    agent = _spawn("bash", "-c", "RANK=1 sleep 60 & wait")
    other = _spawn("sleep", "60")
    deadline = time.monotonic() + 10
    while not (kids := torchrun.descendants(agent.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    (worker,) = kids
    os.kill(worker, signal.SIGSTOP)
    events = tmp_path / "events.jsonl"
    t0 = time.monotonic()
    rc = torchrun.wait_all([agent, other], timeout_s=1.0, events=str(events), poll_s=0.1)
    assert rc == 1 and time.monotonic() - t0 < 1.0 + torchrun.MARGIN_S
    (e,) = read_events(events)
    assert e["kind"] == torchrun.STOPPED
    assert f"worker rank 1 (pid {worker}) under agent 0 stopped responding" in e["reason"]
    assert [p for p in (agent.pid, other.pid, worker) if _alive(p)] == []


def test_an_agent_left_after_the_others_ended_well_is_ended(monkeypatch) -> None:
    from bench.cluster import torchrun

    monkeypatch.setattr(torchrun, "GRACE_S", 1.0)
    done, left = _spawn("true"), _spawn("sleep", "60")
    os.kill(left.pid, signal.SIGSTOP)  # an agent stopped: its workers ended, it did not
    assert torchrun.wait_all([done, left], timeout_s=1.0, poll_s=0.1) == 1
    assert not _alive(left.pid)


def _rank_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((e[5:].decode() for e in env if e.startswith(b"RANK=")), None)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["worker", "agent"])
def test_a_stopped_process_ends_a_two_agent_run_within_the_bound(tmp_path: Path, victim: str):
    from bench.cluster import torchrun
    from tests.test_fault_tolerance import _start, _workers

    timeout = 15
    proc = _start(
        tmp_path, "cluster.nnodes=2", "cluster.nproc_per_node=1", f"comm.timeout_s={timeout}",
        "train.epochs=200", "train.checkpoint_every=0",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "curves").is_dir():  # an epoch done: every process is up
            assert proc.poll() is None, proc.stdout.read()[-3000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "no epoch in time"
            time.sleep(0.2)
        workers = _workers(tmp_path)
        (rank0,) = [p for p in workers if _rank_of(p) == "0"]
        stat = Path(f"/proc/{rank0}/stat").read_text()
        pid = rank0 if victim == "worker" else int(stat[stat.rindex(")") + 2 :].split()[1])
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=timeout + torchrun.MARGIN_S + 60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    # the launcher's own record and cleanup, on a loaded machine: 15 s more at most
    assert took < timeout + torchrun.MARGIN_S + 15, (took, out[-3000:])
    assert proc.returncode != 0
    (rec,) = records.load_records(tmp_path)
    who = f"worker rank 0 (pid {pid})" if victim == "worker" else f"(pid {pid})"
    assert rec["status"] == "error" and who in rec["reason"], rec["reason"]
    assert "stopped" in rec["reason"]
    assert not _alive(pid) and not [p for p in workers if _alive(p)], _workers(tmp_path)


# 3. a sweep with error runs is resumable to completion; a finished table is never replaced


def _fake_queue(full: dict[str, bool], ran: list[str]):
    """A run queue whose workers write their curve first: on a full disk (``full["disk"]``,
    the write raising ENOSPC) each run ends in an ``error`` record."""

    def run_queued(jobs: list[list[str]], sweep_dir: Path, experiment: str) -> list[int]:
        rcs = []
        for job in jobs:
            kv = dict(o.split("=", 1) for o in job if "=" in o)
            rid = f"20261203-000000-{len(ran):06x}"  # a run id's form
            ran.append(rid)
            seed = int(kv["train.seed"])
            rec = _record(rid, kv["comm"], seed, 5.0 + seed % 3)
            rec["protocol"] = {
                "name": kv["results.protocol"], "role": kv["results.protocol_role"],
                "trial": kv["results.protocol_trial"], "selected": False,
            }  # fmt: skip
            rec["config"]["results"] = {"sweep_id": kv["results.sweep_id"]}
            rec["train_time_s"], rec["step_time_s"] = 6.0, 0.4
            try:
                if full["disk"]:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "curve")
                _curve(records.curve_path(kv["results.dir"], rid), rec["time_to_target_s"])
            except OSError as e:
                rec.update(status="error", time_to_target_s=None, reason=str(e))
            records.append_record(kv["results.dir"], rec)
            rcs.append(0 if rec["status"] == "ok" else 1)
        return rcs

    return run_queued


def test_a_resumed_sweep_runs_the_named_runs_again_and_keeps_their_records(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from bench.results.records import load_records
    from bench.sweeps import common
    from reproduce import ablation

    full, ran = {"disk": True}, []  # every run an error: the sweep stops after its tuning
    monkeypatch.setattr(common, "run_queued", _fake_queue(full, ran))
    base = ["--results-dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        ablation.main(["--quick", "--sweep-id", "s1", *base])
    first, again = len(ran), ran[:2]
    for bad, why in (
        (["--resume", "s1", "--rerun", "20261203-000000-ffffff"], "is not a run of sweep s1"),
        (["--resume", "s1", "--rerun", "r1"], "not a run id: r1"),
        (["--quick", "--sweep-id", "s2", "--rerun", again[0]], "--rerun needs --resume"),
        (["--resume", "s1", "--keep-out"], "--keep-out goes with --resume SWEEP_ID of a"),
        (["--quick", "--sweep-id", "s2", "--keep-out"], "--keep-out goes with --resume"),
    ):
        with pytest.raises(SystemExit) as e:
            ablation.main([*bad, *base])
        assert e.value.code == 2 and why in capsys.readouterr().err
    assert len(ran) == first  # refused before any run
    full["disk"] = False
    with contextlib.suppress(SystemExit):  # the other error runs stay errors
        ablation.main(["--resume", "s1", "--rerun", ",".join(again), *base])
    recs = load_records(tmp_path)
    assert len(ran) == first + 2 and len(recs) == first + 2  # those two, every record kept
    assert {r["run_id"] for r in recs} == set(ran)
    assert [r["status"] for r in recs[-2:]] == ["ok", "ok"]


def test_rerun_takes_the_run_ids_the_records_make() -> None:
    from bench.results.records import new_run_id
    from reproduce import _sweep

    rid = new_run_id()
    assert _sweep.run_ids(f"{rid}, {rid}") == (rid, rid)


# 4. a resume holds a lock on the run


def test_a_second_concurrent_resume_is_refused_in_one_line(tmp_path: Path, monkeypatch, capsys):
    from filelock import FileLock

    from bench.launch import run
    from reproduce.__main__ import main

    _fake_checkpoint(tmp_path, "r1")
    records.append_record(tmp_path, {"run_id": "r1", "status": "interrupted"})
    monkeypatch.setattr(run, "launch_and_record", lambda *a: (0, None))  # never launched
    held = FileLock(str(ck.run_dir(tmp_path, "r1")) + ".lock")
    with held:  # the first resume, still running
        with pytest.raises(SystemExit) as e:
            main(["train", "resume=r1", f"results.dir={tmp_path}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "r1 is being resumed by another process" in err[0], err
    with pytest.raises(SystemExit) as e:  # once it ended, the next one goes ahead
        main(["train", "resume=r1", f"results.dir={tmp_path}"])
    assert e.value.code == 0


# 5. paths and values a run would fail on are refused first, in one line; paths quoted


def _one_line_exit(capsys, call, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        call(list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("results.dir=/proc", "not writable"),
        ("results.dir=/proc/bench", "not writable"),
        ("results.dir=", "is empty"),
        ("results.dir={tmp}/gone", "dangling link"),
        ("results.dir={tmp}/gone/deeper", "dangling link"),
        ("train.seed=99999999999999999999", "train.seed must be in 0..4294967295"),
        ("train.seed=-1", "train.seed must be in"),
        ("data.split_seed=-5", "data.split_seed must be in"),
    ],
)
def test_what_a_run_would_fail_on_is_refused_by_the_dry_run(
    tmp_path: Path, capsys, override: str, says: str
) -> None:
    from reproduce.__main__ import main

    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    override = override.format(tmp=tmp_path)
    line = _one_line_exit(capsys, main, "train", "--dry-run", override)
    assert says in line, line


def test_a_run_on_a_file_system_that_takes_no_files_is_refused_before_hydra(capsys) -> None:
    from reproduce.__main__ import main

    line = _one_line_exit(capsys, main, "train", "results.dir=/proc")
    assert line.startswith("error: results.dir='/proc' is not writable"), line


@pytest.mark.parametrize("sid", ["x" * 300, "../../x", "a/b", ".."])
def test_sweep_ids_are_checked_like_file_names(tmp_path: Path, capsys, sid: str) -> None:
    from reproduce import ablation

    line = _one_line_exit(capsys, ablation.main, "--quick", "--dry-run", "--sweep-id", sid,
                          "--results-dir", str(tmp_path))  # fmt: skip
    assert "it names files" in line, line
    assert not list(tmp_path.parent.glob("x*"))


def test_compare_of_an_error_run_without_a_curve_is_one_line(tmp_path: Path, capsys) -> None:
    from reproduce import compare

    rec = _record("r-err", "dense", 0, None, status="error", reason="OSError: disk full")
    records.append_record(tmp_path, rec)
    line = _one_line_exit(capsys, compare.main, "r-err", "--results-dir", str(tmp_path),
                          "--out", str(tmp_path / "c.png"))  # fmt: skip
    assert "r-err has no curve" in line and "disk full" in line, line


WEIRD = "sü, ${x} 'q'"  # a non-ASCII letter, a comma, an interpolation, spaces, quotes


def test_odd_paths_reach_hydra_quoted_for_every_command(tmp_path: Path, capsys) -> None:
    from reproduce import ablation
    from reproduce.__main__ import main

    weird = tmp_path / WEIRD
    main(["train", "--dry-run", "--results-dir", str(weird)])
    assert f"record appended to {weird / 'runs.jsonl'}" in capsys.readouterr().out
    ablation.main(["--quick", "--dry-run", "--results-dir", str(weird), "--sweep-id", "s1"])
    out = capsys.readouterr().out
    assert "first: python -m reproduce train" in out and not list(tmp_path.iterdir())  # checked


def test_a_resume_of_an_odd_path_and_its_printed_hint_work(tmp_path: Path, monkeypatch) -> None:
    import shlex

    from bench.launch import run
    from bench.train.__main__ import _resume_hint
    from reproduce.__main__ import main
    from reproduce._sweep import again

    weird = tmp_path / WEIRD
    _fake_checkpoint(weird, "r1")
    records.append_record(weird, {"run_id": "r1", "status": "interrupted"})
    seen = []
    monkeypatch.setattr(
        run, "launch_and_record", lambda cfg, meta, out: seen.append(cfg) or (0, None)
    )
    with pytest.raises(SystemExit) as e:
        main(["train", "resume=r1", "--results-dir", str(weird)])
    assert e.value.code == 0 and seen[0].results.dir == str(weird)
    hint = _resume_hint({"run": {"run_id": "r1"}, "config": {"results": {"dir": str(weird)}}})
    assert shlex.split(hint)[-1] == f"results.dir={weird}"
    plan = type("P", (), {"sweep_id": "s1", "results_dir": str(weird)})
    assert shlex.split(again("ablation", plan))[-1] == str(weird)


# 6. one launch folder per run, every attempt's code, the mismatched key, epochs by number


def test_runs_started_in_the_same_second_get_a_launch_folder_each(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from bench.config import register_configs

    register_configs()
    dirs = set()
    for _ in range(3):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[f"results.dir={tmp_path}"],
                          return_hydra_config=True)  # fmt: skip
            dirs.add(str(cfg.hydra.run.dir))
    assert len(dirs) == 3, dirs


def test_a_resume_under_other_code_warns_and_the_record_lists_each_attempts(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from bench.config import Config, to_container
    from bench.launch.run import prepare_resume
    from bench.results import env

    _fake_checkpoint(tmp_path, "r1")
    records.append_record(tmp_path, {"run_id": "r1", "status": "interrupted", "git_sha": "aaa"})
    monkeypatch.setenv("BENCH_GIT_SHA", "bbb")
    env.git_sha.cache_clear()
    try:
        _, meta, _ = prepare_resume("r1", [f"results.dir={tmp_path}"], dry=True)
        rec = records.RunRecord.start(Config(), meta, config=to_container(Config()),
                                      comm_sparse=False)  # fmt: skip
    finally:
        env.git_sha.cache_clear()
    assert meta["git_shas"] == ["aaa"] and rec.git_shas == ["aaa", "bbb"]
    err = capsys.readouterr().err
    assert "warning: run r1 ran the code of aaa; attempt 2 runs bbb" in err, err


def test_a_checkpoint_of_another_shape_names_the_first_mismatched_key(tmp_path: Path) -> None:
    from bench.registry import ConfigError
    from bench.train.checkpoint import CheckpointManager

    d = _fake_checkpoint(tmp_path, "r1")
    saved = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    torch.save({"model": saved.state_dict()}, d / "common.pt")
    manifest = json.loads(d.with_suffix(".json").read_text()) | {"path": str(d)}
    manifest["files"] = ck.shard_sizes(d)
    now = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 5))  # another head
    from tests.test_faults import _config

    cfg = _config(tmp_path, *TINY)
    m = CheckpointManager(cfg, manifest["run"], rank=0, world=manifest["world_size"],
                          device=torch.device("cpu"), states={"model": now},
                          progress=None)  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(ConfigError) as e:
        m.load(manifest)
    assert str(e.value).endswith("model: 1.weight has shape (2, 4) in the checkpoint, (5, 4) now")


def test_checkpoints_are_ordered_by_number_past_epoch_9999(tmp_path: Path) -> None:
    for epoch in (9998, 9999, 10000):
        _fake_checkpoint(tmp_path, "r1", epoch=epoch)
    assert ck.latest(tmp_path, "r1")["epoch"] == 10000
    names = [p.name for p in ck.by_epoch(ck.run_dir(tmp_path, "r1").glob("epoch-*.json"))]
    assert names == ["epoch-9998.json", "epoch-9999.json", "epoch-10000.json"]


def test_a_signal_that_stops_a_stage_stops_the_sweep(monkeypatch) -> None:
    """An interrupted queue (Ctrl-C, SIGTERM) ends the sweep; the next stage never starts."""
    from bench.sweeps import common

    monkeypatch.setattr(common, "compose_all", lambda jobs: jobs)
    done = [(0, {"status": "ok"})]
    stops = ([(0, {"status": "interrupted"})], [(1, {"status": "interrupted"}), (130, None)])
    for stopped in stops:
        monkeypatch.setattr(common, "run_queue", lambda *a, r=stopped, **k: done + r)
        with pytest.raises(KeyboardInterrupt):
            common.run_queued([["a=1"]] * (1 + len(stopped)), "out", "e")
    monkeypatch.setattr(common, "run_queue", lambda *a, **k: [*done, (1, {"status": "error"})])
    assert common.run_queued([["a=1"], ["a=2"]], "out", "e") == [0, 1]  # a failure goes on
