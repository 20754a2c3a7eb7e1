"""Records are appended atomically and never rewritten; curves are never replaced."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pandas as pd
import pytest

from bench.results import records


def _writer(d: str, i: int, n: int) -> None:
    for j in range(n):
        records.append_record(d, {"run_id": f"r{i}-{j}", "status": "ok", "pad": "x" * 70000})


def test_concurrent_appends_keep_every_record(tmp_path: Path) -> None:
    """8 processes appending at once (a parallel multirun): every line whole, none lost."""
    records.append_record(tmp_path, {"run_id": "old", "status": "ok"})
    ctx = mp.get_context("fork")  # the writers import nothing that forking could break
    ps = [ctx.Process(target=_writer, args=(str(tmp_path), i, 1)) for i in range(8)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(60)
    assert [p.exitcode for p in ps] == [0] * 8
    lines = records.runs_path(tmp_path).read_text().splitlines()
    ids = [json.loads(line)["run_id"] for line in lines]  # each line valid JSON
    assert ids[0] == "old"
    assert len(ids) == 9 and len(set(ids)) == 9


def test_a_torn_line_is_skipped_with_a_warning_and_not_glued_to(tmp_path: Path) -> None:
    records.append_record(tmp_path, {"run_id": "a", "status": "ok"})
    with open(records.runs_path(tmp_path), "a") as f:
        f.write('{"run_id": "b", "sta')  # a writer killed mid-line
    records.append_record(tmp_path, {"run_id": "c", "status": "ok"})
    with pytest.warns(UserWarning, match=r"runs.jsonl:2: skipped"):
        recs = records.load_records(tmp_path)
    assert [r["run_id"] for r in recs] == ["a", "c"]


def test_a_record_is_never_appended_twice_and_a_resume_is_a_new_attempt(tmp_path: Path) -> None:
    records.append_record(tmp_path, {"run_id": "a", "status": "interrupted"})
    with pytest.raises(records.AlreadyRecorded):
        records.append_record(tmp_path, {"run_id": "a", "status": "ok"})
    records.append_record(tmp_path, {"run_id": "a", "status": "ok", "attempt": 2})
    assert [r["status"] for r in records.load_records(tmp_path)] == ["ok"]
    assert len(records.load_records(tmp_path, attempts=True)) == 2
    assert records.find_record(tmp_path, "a")["attempt"] == 2


def test_bad_status_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        records.append_record(tmp_path, {"run_id": "x", "status": "great"})


def test_curve_is_never_replaced(tmp_path: Path) -> None:
    records.write_curve(tmp_path, "run1", [{"epoch": 1, "top1": 0.5}])
    with pytest.raises(FileExistsError):
        records.write_curve(tmp_path, "run1", [{"epoch": 1, "top1": 0.9}])
    # read back under today's name (a flat-named curve is renamed on reading)
    assert records.load_curve(tmp_path, "run1")["acc/top1"].tolist() == [0.5]
    assert not list((tmp_path / "curves").glob(".*tmp"))
    # a run's curve grows epoch by epoch; another curve never replaces it
    grown = [{"epoch": 1, "top1": 0.5}, {"epoch": 2, "top1": 0.7}]
    records.write_curve(tmp_path, "run1", grown, extend=True)
    assert records.load_curve(tmp_path, "run1")["acc/top1"].tolist() == [0.5, 0.7]
    with pytest.raises(FileExistsError):
        records.write_curve(tmp_path, "run1", [{"epoch": 3, "top1": 0.1}], extend=True)
    assert not list((tmp_path / "curves").glob(".*tmp"))


def test_committed_curves_read_with_todays_names() -> None:
    from bench.results.columns import RENAMES, metric_column
    from bench.results.timing import time_to_target_steps

    results = Path(__file__).resolve().parents[1] / "results"
    flat_seen = False
    for rec in records.load_records(results):
        if rec.get("epochs_run") == 0:  # refused before training (e.g. a failed link
            # check), or interrupted (Ctrl-C) before its first epoch ended
            assert not records.curve_path(results, rec["run_id"]).exists()
            assert rec["status"] in ("error", "interrupted") and rec["time_to_target_s"] is None
            continue
        raw = pd.read_csv(records.curve_path(results, rec["run_id"]))
        flat = "train_time_s" in raw.columns  # written before the namespacing
        flat_seen |= flat
        curve = records.load_curve(results, rec["run_id"])
        assert not set(curve.columns) & set(RENAMES)
        # the record's target metric, under today's name (a workload may report no top-1)
        metric = rec["target_metric"]
        now = metric_column(metric)
        pd.testing.assert_series_equal(  # NaN where an epoch was not evaluated
            curve[now].reset_index(drop=True),
            raw[metric if flat else now].reset_index(drop=True),
            check_names=False,
        )
        # the recorded time to target follows from the curve and the record's sub-epoch
        # evaluations alone (runs with train.eval_every_steps evaluate inside an epoch)
        tt, epoch, _ = time_to_target_steps(
            curve.to_dict("records"), rec.get("evals") or (), rec["target_metric"],
            rec["target_value"],
        )  # fmt: skip
        assert (tt, epoch) == (rec["time_to_target_s"], rec["epochs_to_target"])
    assert flat_seen


def test_run_record_is_the_one_schema(tmp_path: Path) -> None:
    from bench.config import Config, to_container

    cfg = Config()
    run = {"run_id": records.new_run_id(), "started_at": records.now_iso(), "launch_time": 0.0}
    rec = records.RunRecord.start(cfg, run, config=to_container(cfg), comm_sparse=False)
    assert rec.status == "error" and rec.time_to_target_s is None and rec.hardware
    curve = [
        {"epoch": 1, "clock/train_s": 2.0, "acc/top1": 0.5, "data/samples": 100},
        {"epoch": 2, "clock/train_s": 4.0, "acc/top1": 0.99, "data/samples": 100},
    ]
    done = rec.finish(curve, status="ok", train_time_s=4.0, world_size=2, launch_time=0.0)
    assert (done.time_to_target_s, done.epochs_to_target, done.best_value) == (4.0, 2, 0.99)
    assert done.throughput_samples_per_s == 50.0 and done.epochs_run == 2
    done.append(tmp_path)
    (line,) = records.load_records(tmp_path)
    assert tuple(line) == records.RECORD_FIELDS and line["comm_density"] == 1.0
    assert line["protocol"] is None and line["steps_to_target"] is None  # not a protocol run


def test_a_protocol_run_says_what_it_was_for() -> None:
    from bench.config import Config, to_container

    cfg = Config()
    cfg.results.protocol, cfg.results.protocol_role = "equal-budget-v1", "eval"
    cfg.results.protocol_trial, cfg.results.protocol_selected = "d0.01-warmup", True
    run = {"run_id": records.new_run_id(), "started_at": records.now_iso(), "launch_time": 0.0}
    rec = records.RunRecord.start(cfg, run, config=to_container(cfg), comm_sparse=True)
    assert rec.protocol == {
        "name": "equal-budget-v1",
        "role": "eval",
        "trial": "d0.01-warmup",
        "selected": True,
    }
    curve = [{"epoch": 1, "clock/train_s": 2.0, "data/steps": 10, "acc/top1": 0.5}]
    evals = [{"step": 4, "epoch": 1, "clock/train_s": 0.8, "acc/top1": 0.99}]
    done = rec.finish(curve, status="ok", train_time_s=2.0, world_size=2, launch_time=0.0,
                      evals=evals)  # fmt: skip
    assert (done.time_to_target_s, done.epochs_to_target, done.steps_to_target) == (0.8, 1, 4)
    assert done.evals == evals
