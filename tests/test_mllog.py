"""The MLPerf log of a run: written by rank 0 only, one file per run even when several runs
train in one process, and accepted by mlperf-logging's compliance checker (training rules
3.1.0, open division, benchmark resnet); the record names it beside the DAWNBench files."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_dir

from bench.config import Config, register_configs, to_container, to_object
from bench.results import mllog, records
from bench.results.mllog import RunLog, read_events
from tests.conftest import REPO

register_configs()


def compliance(path: str | Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """mlperf-logging's checker on ``path`` as a user runs it (rc 0: the log passes)."""
    return subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training"]
        + ["--ruleset", "3.1.0", "--log_output", str(tmp_path / "checker.log"), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


def _payload(results: Path, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(
            config_name="config",
            overrides=[
                f"results.dir={results}",
                "model.width=4",
                "train.max_steps_per_epoch=1",
                "train.progress=false",
                "data.batch_size=32",
                "data.eval_batch_size=512",
                "results.plot=false",
                "train.checkpoint_every=0",
                *overrides,
            ],
        )
    run = {
        "run_id": records.new_run_id(),
        "started_at": records.now_iso(),
        "launch_time": time.time(),
        "experiment": "test",
    }
    return {"config": to_container(to_object(cfg)), "run": run}


def test_two_runs_in_one_process_each_write_their_own_compliant_log(tmp_path: Path) -> None:
    from bench.train.loop import train

    recs = []
    runs = {"Org A": 2, "Org B": 1}  # author: epochs; one worker each, in this process
    for who, epochs in runs.items():
        recs.append(train(_payload(tmp_path, f"results.author={who}", f"train.epochs={epochs}")))
    for rec, (who, epochs) in zip(recs, runs.items()):
        assert rec["mllog"] == str(tmp_path / "mllog" / f"{rec['run_id']}.log")
        ev = read_events(rec["mllog"])
        keys = [e["key"] for e in ev]
        assert keys.count("run_start") == keys.count("run_stop") == 1
        assert [e["value"] for e in ev if e["key"] == "submission_org"] == [who]  # not mixed
        evals = [e["metadata"]["epoch_num"] for e in ev if e["key"] == "eval_accuracy"]
        assert evals == list(range(1, epochs + 1))
        acc = [e["value"] for e in ev if e["key"] == "eval_accuracy"]
        curve = records.read_curve(rec["curve"])
        assert acc == list(curve["acc/top1"])  # the curve's numbers, not a second truth
        stop = next(e for e in ev if e["key"] == "run_stop")["metadata"]
        assert stop["status"] == ("success" if rec["status"] == "ok" else "aborted")
        assert next(e["value"] for e in ev if e["key"] == "eval_samples") == 360  # digits test
        p = compliance(rec["mllog"], tmp_path)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        assert "SUCCESS" in p.stderr
        # the DAWNBench files of the same run, named by its record
        assert Path(rec["dawnbench_json"]).is_file() and Path(rec["dawnbench_tsv"]).is_file()
        assert json.loads(Path(rec["dawnbench_json"]).read_text())["author"] == who
    on_disk = records.load_records(tmp_path)
    assert [r["mllog"] for r in on_disk] == [r["mllog"] for r in recs]


def _fake_state(tmp_path: Path, author: str = "unknown") -> SimpleNamespace:
    cfg = Config()
    cfg.results.author = author
    evals = SimpleNamespace(epoch_stats=lambda: {"data/rank_samples": 100})
    data = SimpleNamespace(train_samples=1000, eval=evals)
    work = SimpleNamespace(data=data)
    return SimpleNamespace(
        cfg=cfg, world=1, nnodes=1, steps=4, epoch=0, device="cpu", workload=work
    )


def _one_epoch_log(log: RunLog, s: SimpleNamespace, top1: float = 0.5) -> None:
    log.begin(
        s.cfg,
        world=s.world,
        nnodes=s.nnodes,
        steps_per_epoch=s.steps,
        train_samples=s.workload.data.train_samples,
        first_epoch=s.epoch + 1,
        init_start_s=time.time(),
    )
    log.epoch_start(1)
    log.epoch_stop(1, 1000)
    log.eval_start(1)
    log.eval_stop(1, "top1", top1, samples=100)


def test_ranks_other_than_0_write_nothing(tmp_path: Path) -> None:
    log = RunLog.open(tmp_path, "r1", rank=1)
    _one_epoch_log(log, _fake_state(tmp_path))
    assert log.run_stop("ok") is None and not (tmp_path / "mllog").exists()


def test_the_checker_is_a_real_check(tmp_path: Path) -> None:
    """A complete log passes; the same log without its run_stop, or from a run whose one
    evaluation reached 100 % (the open resnet rule wants one below 1.0), fails."""
    s = _fake_state(tmp_path)
    log = RunLog.open(tmp_path, "good", rank=0)
    _one_epoch_log(log, s)
    path = log.run_stop("target_missed")
    assert compliance(path, tmp_path).returncode == 0
    cut = tmp_path / "cut.log"
    cut.write_text("".join(Path(path).read_text().splitlines(True)[:-1]))
    assert compliance(cut, tmp_path).returncode != 0
    perfect = RunLog.open(tmp_path, "perfect", rank=0)
    _one_epoch_log(perfect, s, top1=1.0)
    assert compliance(perfect.run_stop("ok"), tmp_path).returncode != 0


def test_the_launcher_ends_the_log_of_workers_that_died(tmp_path: Path) -> None:
    log = RunLog.open(tmp_path, "dead", rank=0)
    _one_epoch_log(log, _fake_state(tmp_path))
    log.close()  # the worker died here: no run_stop
    path = mllog.close_after_failure(tmp_path, "dead", "worker rank 0 exited with code -9")
    assert path == str(mllog.log_path(tmp_path, "dead"))
    mllog.close_after_failure(tmp_path, "dead", "again")  # already ended: nothing added
    stops = [e for e in read_events(path) if e["key"] == "run_stop"]
    assert len(stops) == 1 and stops[0]["metadata"]["status"] == "aborted"
    assert "code -9" in stops[0]["metadata"]["reason"]
    assert compliance(path, tmp_path).returncode == 0
    assert mllog.close_after_failure(tmp_path, "never-started", "x") is None


@pytest.mark.slow
def test_a_two_worker_run_logs_on_rank_0_only(tmp_path: Path) -> None:
    from tests.conftest import TINY, run_cli

    p = run_cli("train", f"results.dir={tmp_path}", "train.epochs=2", *TINY)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = records.load_records(tmp_path)[0]
    assert list((tmp_path / "mllog").iterdir()) == [Path(rec["mllog"])]
    ev = read_events(rec["mllog"])
    assert [e["key"] for e in ev].count("epoch_start") == 2
    assert compliance(rec["mllog"], tmp_path).returncode == 0
