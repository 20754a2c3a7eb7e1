"""Time-to-target bookkeeping on scripted curves (DAWNBench's rule)."""

from __future__ import annotations

import math
import time

from bench.results.timing import TrainClock, best_value
from tests.helpers.timing import time_to_target


def test_first_epoch_at_or_above_target_counts() -> None:
    curve = [
        {"epoch": 1, "train_time_s": 10.0, "top1": 0.90},
        {"epoch": 2, "train_time_s": 20.0, "top1": 0.98},  # exactly the target: reached
        {"epoch": 3, "train_time_s": 30.0, "top1": 0.99},
    ]
    assert time_to_target(curve, "top1", 0.98) == (20.0, 2)
    assert best_value(curve, "top1") == 0.99


def test_missed_target_and_skipped_evaluations() -> None:
    curve = [
        {"epoch": 1, "train_time_s": 5.0, "top1": math.nan},  # no evaluation that epoch
        {"epoch": 2, "train_time_s": 9.0, "top1": 0.5},
    ]
    assert time_to_target(curve, "top1", 0.9) == (None, None)
    curve[0]["top1"] = math.nan
    curve.append({"epoch": 3, "train_time_s": 12.0, "top1": 0.95})
    assert time_to_target(curve, "top1", 0.9) == (12.0, 3)


def test_clock_excludes_paused_time() -> None:
    clock = TrainClock()
    clock.start()
    time.sleep(0.05)
    clock.pause()
    time.sleep(0.2)  # "evaluation": must not count
    clock.resume()
    time.sleep(0.05)
    t = clock.pause()
    assert 0.09 <= t < 0.2
    clock2 = TrainClock()
    clock2.load_state_dict(clock.state_dict())
    assert clock2.elapsed == t


def test_a_sub_epoch_evaluation_resolves_time_to_target_below_an_epoch() -> None:
    from bench.results.timing import time_to_target_steps

    curve = [
        {"epoch": 1, "clock/train_s": 10.0, "data/steps": 11, "acc/top1": 0.90},
        {"epoch": 2, "clock/train_s": 20.0, "data/steps": 11, "acc/top1": 0.985},
    ]
    assert time_to_target_steps(curve, [], "top1", 0.98) == (20.0, 2, 22)  # epoch end
    evals = [  # every 2 steps inside the epochs
        {"step": 14, "epoch": 2, "clock/train_s": 12.7, "acc/top1": 0.95},
        {"step": 16, "epoch": 2, "clock/train_s": 14.5, "acc/top1": 0.981},  # the first hit
        {"step": 18, "epoch": 2, "clock/train_s": 16.4, "acc/top1": 0.99},
    ]
    assert time_to_target_steps(curve, evals, "top1", 0.98) == (14.5, 2, 16)
    assert time_to_target_steps(curve, evals, "top1", 0.999) == (None, None, None)
