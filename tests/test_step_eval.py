"""Evaluations inside an epoch (``train.eval_every_steps``) on 2 gloo workers: they land
after the right steps, stay off the training clock, and a target reached between two
epoch ends stops the run there with its step count recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from tests.conftest import TINY, run_cli

FOUR_STEPS = [o for o in TINY if not o.startswith("train.max_steps_per_epoch")] + [
    "train.max_steps_per_epoch=4",
    "train.eval_every_steps=2",
]


def _record(results: Path) -> dict:
    (line,) = (results / "runs.jsonl").read_text().splitlines()
    return json.loads(line)


def test_sub_epoch_evaluations_land_after_the_steps_and_off_the_clock(tmp_path: Path) -> None:
    # an unreachable target: every evaluation runs, after steps 2 and 6 (4 and 8 end epochs)
    p = run_cli("train", f"results.dir={tmp_path / 'a'}", "train.epochs=2",
                "train.target_value=1.0", *FOUR_STEPS)  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = _record(tmp_path / "a")
    curve = pd.read_csv(rec["curve"])
    assert [e["step"] for e in rec["evals"]] == [2, 6] and [e["epoch"] for e in rec["evals"]] == [
        1,
        2,
    ]
    t_end = list(curve["clock/train_s"])
    assert (
        0
        < rec["evals"][0]["clock/train_s"]
        < t_end[0]
        < rec["evals"][1]["clock/train_s"]
        < t_end[1]
    )
    # the evaluations inside the epochs are not training time
    assert abs(t_end[-1] - curve["clock/epoch_s"].sum()) < 0.05
    assert rec["status"] == "target_missed" and rec["steps_to_target"] is None


def test_a_target_reached_inside_an_epoch_stops_the_run_there(tmp_path: Path) -> None:
    # an easy target (top-5 >= 1 %) is reached after step 2: the run stops there
    easy = ["train.target_metric=top5", "train.target_value=0.01", "train.epochs=2"]
    p = run_cli("train", f"results.dir={tmp_path / 'b'}", *easy, *FOUR_STEPS)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = _record(tmp_path / "b")
    curve = pd.read_csv(rec["curve"])
    assert rec["status"] == "ok" and rec["steps_to_target"] == 2 and rec["epochs_to_target"] == 1
    assert rec["time_to_target_s"] == rec["evals"][0]["clock/train_s"]
    assert rec["epochs_run"] == 1 and list(curve["data/steps"]) == [2]


EIGHT_EVERY = [o for o in TINY if not o.startswith("train.max_steps_per_epoch")] + [
    "train.max_steps_per_epoch=8",
    "train.eval_every_steps=1",
    "train.target_metric=top5",
    "train.target_value=0.01",  # reached at the first evaluation point, step 1
]


def test_a_strided_evaluation_finds_the_first_step_at_the_target(tmp_path: Path) -> None:
    # every 4th point evaluated (step 4); it reaches the target, so the models kept at
    # steps 1-3 are evaluated oldest first: step 1 reaches it, as evaluating every step would
    p = run_cli("train", f"results.dir={tmp_path / 'c'}", "train.eval_stride=4", *EIGHT_EVERY)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = _record(tmp_path / "c")
    assert [e["step"] for e in rec["evals"]] == [1, 4]
    assert rec["status"] == "ok" and rec["steps_to_target"] == 1
    assert rec["time_to_target_s"] == rec["evals"][0]["clock/train_s"]
    assert rec["evals"][0]["clock/train_s"] < rec["evals"][1]["clock/train_s"]


def test_no_evaluation_before_eval_from_step(tmp_path: Path) -> None:
    p = run_cli("train", f"results.dir={tmp_path / 'd'}", "train.eval_from_step=3", *EIGHT_EVERY)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rec = _record(tmp_path / "d")
    assert [e["step"] for e in rec["evals"]] == [3] and rec["steps_to_target"] == 3


def test_a_stride_without_stopping_at_the_target_is_refused(tmp_path: Path) -> None:
    p = run_cli("train", f"results.dir={tmp_path / 'e'}", "train.eval_stride=4",
                "train.stop_at_target=false", *EIGHT_EVERY)  # fmt: skip
    assert p.returncode != 0 and "train.eval_stride > 1 needs" in p.stdout + p.stderr
