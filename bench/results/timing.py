"""Time-to-accuracy, defined once (DAWNBench's rule) and used by everything that reports it.

*Training time* counts from the first training step's data request to the end of the
last training step, including data loading and preprocessing, gradient communication and
the optimizer update; it excludes start-up (process launch, model build, data set
indexing) and every evaluation.  *Time-to-target* is the training time at the end of the
first epoch whose held-out evaluation is at or above the target; *epochs to target* is
that epoch's number (1-based).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import Any


class TrainClock:
    """A stopwatch of training time: paused around evaluations and checkpoints."""

    def __init__(self) -> None:
        self._elapsed = 0.0
        self._since: float | None = None

    def start(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    resume = start

    def pause(self) -> float:
        if self._since is not None:
            self._elapsed += time.perf_counter() - self._since
            self._since = None
        return self._elapsed

    @property
    def elapsed(self) -> float:
        run = time.perf_counter() - self._since if self._since is not None else 0.0
        return self._elapsed + run

    def state_dict(self) -> dict[str, float]:
        return {"elapsed": self.elapsed}

    def load_state_dict(self, d: Mapping[str, float]) -> None:
        self._elapsed, self._since = float(d["elapsed"]), None


def reached(value: float | None, target: float) -> bool:
    return value is not None and not math.isnan(value) and value >= target


def time_to_target(
    curve: Iterable[Mapping[str, Any]], metric: str, target: float, time_key: str = "train_time_s"
) -> tuple[float | None, int | None]:
    """(training time, epoch) of the first evaluation at or above ``target``; (None, None) if none.

    ``curve`` rows are the per-epoch rows of a run in order; rows without an evaluation
    (``metric`` missing or NaN) are skipped.
    """
    for row in curve:
        v = row.get(metric)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        if reached(float(v), target):
            return float(row[time_key]), int(row["epoch"])
    return None, None


def best_value(curve: Iterable[Mapping[str, Any]], metric: str) -> float | None:
    vals = [float(r[metric]) for r in curve if r.get(metric) is not None and not math.isnan(float(r[metric]))]
    return max(vals) if vals else None
