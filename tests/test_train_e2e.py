"""End to end on 2 gloo workers: a few steps train and leave a valid record and curve;
a Hydra multirun runs every job."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from bench.results.records import RECORD_FIELDS
from tests.conftest import TINY, run_cli


def test_two_worker_run_writes_record_and_curve(tmp_path: Path) -> None:
    p = run_cli("train", f"results.dir={tmp_path}", "train.epochs=2", "results.plot=true",
                *[o for o in TINY if o != "results.plot=false"])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    for f in RECORD_FIELDS:
        assert f in rec, f
    assert rec["world_size"] == 2 and rec["nnodes"] == 1 and rec["comm"] == "dense"
    assert rec["status"] in ("ok", "target_missed")
    assert rec["train_time_s"] > 0 and rec["wall_time_s"] >= rec["train_time_s"]
    assert rec["config"]["model"]["width"] == 4
    curve = pd.read_csv(rec["curve"])
    assert list(curve["epoch"]) == [1, 2]
    assert curve["train_time_s"].is_monotonic_increasing
    assert (curve["steps"] == 2).all() and curve["top1"].between(0, 1).all()
    # training time excludes evaluation: the curve's time is the sum of epoch train times
    assert abs(curve["train_time_s"].iloc[-1] - curve["epoch_train_s"].sum()) < 0.05
    assert Path(rec["figure"]).is_file()
    # a second run appends, never rewrites
    p = run_cli("train", f"results.dir={tmp_path}", "train.epochs=1", "cluster.nproc_per_node=1", *TINY)
    assert p.returncode == 0, p.stderr[-3000:]
    lines2 = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert lines2[0] == lines[0] and len(lines2) == 2


def test_multirun_runs_every_job(tmp_path: Path) -> None:
    p = run_cli("train", "-m", "model=resnet9,resnet18", "data=digits", f"results.dir={tmp_path}",
                "train.epochs=1", "cluster.nproc_per_node=1", "train.max_steps_per_epoch=1", *TINY[2:],
                f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert sorted(r["model"] for r in recs) == ["resnet18", "resnet9"]
