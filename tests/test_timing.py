"""Time-to-target bookkeeping on scripted curves (DAWNBench's rule)."""

from __future__ import annotations

import math
import time

from bench.results.timing import TrainClock, best_value, time_to_target


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
