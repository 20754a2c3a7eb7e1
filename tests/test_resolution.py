"""How finely a sweep resolves time to target (bench.sweeps.resolution), on hand-made runs
whose bracket and one-sample shift are known, and the digits split's held-out size."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from bench.data import heldout_size, load_digits_split
from bench.sweeps import resolution as rs

N = 360
ONE = 1 / N


def _eval(step: int, t: float, images: int) -> dict:
    return {"step": step, "epoch": 1 + step // 10, "clock/train_s": t, "acc/top1": images / N}


def _epoch(epoch: int, t: float, images: int) -> dict:
    return {"epoch": epoch, "clock/train_s": t, "acc/top1": images / N, "data/steps": 10}


TARGET = 353 / N  # 98 % of 360, as the digits target


def test_the_bracket_is_the_time_since_the_evaluation_before_the_crossing() -> None:
    curve = [_epoch(1, 5.0, 300)]
    evals = [_eval(12, 6.0, 340), _eval(14, 7.5, 352), _eval(16, 8.25, 356)]
    r = rs.run_resolution(curve, evals, "top1", TARGET, ONE)
    assert r["time_to_target_s"] == pytest.approx(8.25)
    assert r["bracket_s"] == pytest.approx(0.75)
    # one image lower (352) is reached at the evaluation before: 0.75 s sooner
    assert r["one_sample_s"] == pytest.approx(0.75)


def test_a_crossing_that_jumps_past_one_image_moves_nothing() -> None:
    evals = [_eval(2, 1.0, 340), _eval(4, 2.0, 350), _eval(6, 3.0, 358)]
    r = rs.run_resolution([], evals, "top1", TARGET, ONE)
    assert r["bracket_s"] == pytest.approx(1.0) and r["one_sample_s"] == 0.0


def test_an_epoch_end_evaluation_counts_and_bleu_has_no_sample_shift() -> None:
    curve = [_epoch(1, 4.0, 340), _epoch(2, 9.0, 355)]
    evals = [_eval(12, 6.0, 346)]
    r = rs.run_resolution(curve, evals, "top1", TARGET)
    assert r["time_to_target_s"] == pytest.approx(9.0) and r["bracket_s"] == pytest.approx(3.0)
    assert "one_sample_s" not in r


def test_a_run_that_never_reached_the_target_has_no_resolution() -> None:
    assert rs.run_resolution([], [_eval(2, 1.0, 300)], "top1", TARGET, ONE) is None


def test_the_summary_over_runs() -> None:
    runs = [
        {"bracket_s": 1.0, "one_sample_s": 0.0},
        {"bracket_s": 0.5, "one_sample_s": 0.5},
        {"bracket_s": 2.0, "one_sample_s": 0.0},
    ]
    s = rs.summary(runs)
    assert s["n"] == 3 and s["bracket_median_s"] == 1.0 and s["bracket_max_s"] == 2.0
    assert s["one_sample_median_s"] == 0.0 and s["one_sample_moved"] == 1
    assert s["one_sample_mean_s"] == pytest.approx(0.5 / 3)
    assert rs.summary([]) == {}


def test_the_sweep_reads_each_records_curve(tmp_path: Path) -> None:
    d = tmp_path / "results"
    (d / "curves").mkdir(parents=True)
    pd.DataFrame([_epoch(1, 4.0, 340), _epoch(2, 9.0, 355)]).to_csv(
        d / "curves" / "a.csv", index=False
    )
    recs = [
        {"run_id": "a", "time_to_target_s": 9.0, "evals": [_eval(12, 6.0, 346)]},
        {"run_id": "missed", "time_to_target_s": None, "evals": []},
        {"run_id": "no-curve", "time_to_target_s": 3.0, "evals": []},
    ]
    runs = rs.sweep_resolution(d, json.loads(json.dumps(recs)), "top1", TARGET, ONE)
    assert len(runs) == 1 and runs[0]["bracket_s"] == pytest.approx(3.0)


def test_the_held_out_size_is_the_splits() -> None:
    assert heldout_size(0.2) == len(load_digits_split(8, 0.2, 0)[3]) == N
