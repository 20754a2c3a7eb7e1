"""End to end on 2 gloo workers: a few steps train and leave a valid record and curve;
a Hydra multirun runs every job."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from bench.results.records import RECORD_FIELDS
from tests.conftest import REPO, TINY, run_cli


def test_two_worker_run_writes_record_and_curve(tmp_path: Path) -> None:
    p = run_cli(
        "train",
        f"results.dir={tmp_path}",
        "train.epochs=2",
        "results.plot=true",
        *[o for o in TINY if o != "results.plot=false"],
    )
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
    assert curve["clock/train_s"].is_monotonic_increasing
    assert (curve["data/steps"] == 2).all() and curve["acc/top1"].between(0, 1).all()
    # training time excludes evaluation: the curve's time is the sum of epoch train times
    assert abs(curve["clock/train_s"].iloc[-1] - curve["clock/epoch_s"].sum()) < 0.05
    # every worker's real samples: 2 steps x 16 per worker x 2 workers
    assert (curve["data/samples"] == 64).all()
    assert Path(rec["figure"]).is_file()
    # a second run appends, never rewrites
    p = run_cli(
        "train", f"results.dir={tmp_path}", "train.epochs=1", "cluster.nproc_per_node=1", *TINY
    )
    assert p.returncode == 0, p.stderr[-3000:]
    lines2 = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert lines2[0] == lines[0] and len(lines2) == 2


def _one_record(results: Path) -> dict:
    lines = (results / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_time_to_target_and_stop_at_target_on_a_real_run(tmp_path: Path) -> None:
    # top-5 of 10 classes >= 1 % is reached at the first evaluation: the run stops there
    easy = ["train.target_metric=top5", "train.target_value=0.01", "train.epochs=3"]
    p = run_cli("train", f"results.dir={tmp_path / 'a'}", *easy, *TINY)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = _one_record(tmp_path / "a")
    curve = pd.read_csv(rec["curve"])
    assert rec["status"] == "ok" and rec["epochs_to_target"] == 1 and rec["epochs_run"] == 1
    assert rec["time_to_target_s"] == curve["clock/train_s"].iloc[0] == rec["train_time_s"]
    assert rec["best_value"] == curve["acc/top5"].iloc[0] >= 0.01
    # without stop_at_target the budget is spent, the time to target stays the first epoch's
    p = run_cli(
        "train",
        f"results.dir={tmp_path / 'b'}",
        *easy[:2],
        "train.epochs=2",
        "train.stop_at_target=false",
        *TINY,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rec = _one_record(tmp_path / "b")
    curve = pd.read_csv(rec["curve"])
    assert rec["status"] == "ok" and rec["epochs_run"] == 2 and rec["epochs_to_target"] == 1
    assert rec["time_to_target_s"] == curve["clock/train_s"].iloc[0] < rec["train_time_s"]
    # an unreachable target: target_missed, no time to target, the whole budget run
    p = run_cli(
        "train", f"results.dir={tmp_path / 'c'}", "train.target_value=1.0", "train.epochs=2", *TINY
    )
    assert p.returncode == 0, p.stderr[-3000:]
    rec = _one_record(tmp_path / "c")
    assert rec["status"] == "target_missed" and rec["epochs_run"] == 2
    assert rec["time_to_target_s"] is None and rec["epochs_to_target"] is None


def test_sparse_comm_without_error_feedback_trains(tmp_path: Path) -> None:
    """mstopk inside a real 2-worker run: 10 % of every bucket sent, residual dropped."""
    p = run_cli(
        "train",
        f"results.dir={tmp_path}",
        "comm=mstopk",
        "comm.density=0.1",
        "comm.error_feedback=false",
        "comm.min_numel=0",
        "train.epochs=1",
        *TINY,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = _one_record(tmp_path)
    curve = pd.read_csv(rec["curve"])
    assert rec["comm"] == "mstopk" and rec["comm_density"] == 0.1
    assert rec["config"]["comm"]["error_feedback"] is False
    assert abs(curve["comm/density"].iloc[0] - 0.1) < 0.01  # measured: elements sent / reduced
    assert rec["comm_bytes_per_step"] > 0 and curve["loss/train"].notna().all()


def test_hitopk_and_flat_update_with_master_weights_train(tmp_path: Path) -> None:
    """hitopk (each worker its own node); the flat update keeps fp32 masters of a bf16 model."""
    p = run_cli(
        "train",
        f"results.dir={tmp_path}",
        "comm=hitopk",
        "comm.procs_per_node=1",
        "comm.density=0.1",
        "comm.min_numel=0",
        "optim.update=flat",
        "optim.master_weights=bf16",
        "train.amp=bf16",
        "train.epochs=1",
        *TINY,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = _one_record(tmp_path)
    curve = pd.read_csv(rec["curve"])
    assert rec["status"] in ("ok", "target_missed") and rec["update"] == "flat"
    assert rec["comm_inter_node_bytes_per_step"] > 0  # 2 nodes: the sparse stage crosses them
    assert curve["loss/train"].map(math.isfinite).all()


def test_multirun_runs_every_job(tmp_path: Path) -> None:
    p = run_cli(
        "train",
        "-m",
        "model=resnet9,resnet18",
        "data=digits",
        f"results.dir={tmp_path}",
        "train.epochs=1",
        "cluster.nproc_per_node=1",
        "train.max_steps_per_epoch=1",
        *TINY[2:],
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert sorted(r["model"] for r in recs) == ["resnet18", "resnet9"]


# A fresh run is compared with this committed record of the default `dawnbench`, measured
# on the hardware it names. On that CPU kind the arithmetic is the same, so the curve must
# match to float rounding. On another CPU kind (vector units, BLAS kernels) the trajectory
# drifts from the first step; what must hold there is the training as a whole: measured on
# an Intel Xeon against this AMD EPYC record, train loss per epoch differed by up to 15 %
# and train top-1 by up to 1.8 points, and the target came one epoch sooner.
REFERENCE_RUN = "20261130-194057-57c3a4"
OTHER_CPU_LOSS_RTOL = 0.3  # relative, per epoch
OTHER_CPU_TRAIN_TOP1_ATOL = 0.04  # fraction, per epoch
OTHER_CPU_EPOCHS_ATOL = 1  # epochs to target


@pytest.mark.slow
def test_dawnbench_reproduces_the_committed_curve(tmp_path: Path) -> None:
    """Same seed, same curve: the embedded default's losses and accuracies, epoch by epoch,
    as in the committed record (timings differ; the arithmetic must not) on the record's
    CPU kind, and within the stated tolerances on any other."""
    from bench.results.env import hardware
    from bench.results.records import load_curve, load_records

    ref_rec = next(r for r in load_records(REPO / "results") if r["run_id"] == REFERENCE_RUN)
    assert ref_rec["experiment"] == "dawnbench_digits" and ref_rec["comm"] == "dense"
    ref = load_curve(REPO / "results", REFERENCE_RUN)
    p = run_cli("dawnbench", f"results.dir={tmp_path}", "train.progress=false", timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = _one_record(tmp_path)
    new = pd.read_csv(rec["curve"])
    if hardware() == ref_rec["hardware"]:
        cols = ["epoch", "loss/train", "acc/train_top1", "acc/top1", "acc/top5", "loss/eval"]
        pd.testing.assert_frame_equal(new[cols], ref[cols], check_exact=False, rtol=1e-6)
        return
    # another CPU kind than the record's: the same training within the stated tolerances
    assert rec["status"] == "ok", f"{hardware()}: target missed against {ref_rec['hardware']}"
    assert abs(rec["epochs_to_target"] - ref_rec["epochs_to_target"]) <= OTHER_CPU_EPOCHS_ATOL
    both = new.merge(ref, on="epoch", suffixes=("", "_ref"))
    assert len(both) >= 4, both["epoch"].tolist()
    loss, loss_ref = both["loss/train"], both["loss/train_ref"]
    assert ((loss - loss_ref).abs() <= OTHER_CPU_LOSS_RTOL * loss_ref).all(), both
    top1 = (both["acc/train_top1"] - both["acc/train_top1_ref"]).abs()
    assert (top1 <= OTHER_CPU_TRAIN_TOP1_ATOL).all(), both
