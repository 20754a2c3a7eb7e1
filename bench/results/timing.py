"""Time-to-accuracy, defined once (DAWNBench's rule): the training time (evaluations
excluded) at the first evaluation at or above the target (docs/internals/results.md)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from bench.results.columns import EPOCH, STEPS, TRAIN_TIME, metric_column, normalise


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


def _metric_values(
    curve: Iterable[Mapping[str, Any]], metric: str
) -> Iterator[tuple[float, dict[str, Any]]]:
    col = metric_column(metric)
    for raw in curve:
        row = normalise(raw)
        v = row.get(col)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue  # no evaluation that epoch
        yield float(v), row


def time_to_target_steps(
    curve: Sequence[Mapping[str, Any]],
    evals: Iterable[Mapping[str, Any]],
    metric: str,
    target: float,
) -> tuple[float | None, int | None, int | None]:
    """(training s, epoch, optimizer steps) at the first evaluation of the per-epoch ``curve``
    or the sub-epoch ``evals`` at or above ``target``; (None, None, None) if none."""
    points: list[tuple[float, int, int | None]] = []
    steps = 0
    for raw in curve:
        row = normalise(raw)
        steps += int(row.get(STEPS) or 0)
        v = row.get(metric_column(metric))
        if v is not None and reached(float(v), target):
            points.append((float(row[TRAIN_TIME]), int(row[EPOCH]), steps or None))
    for v, row in _metric_values(evals, metric):
        if reached(v, target):
            points.append((float(row[TRAIN_TIME]), int(row[EPOCH]), int(row["step"])))
    if not points:
        return None, None, None
    return min(points, key=lambda p: p[0])


def best_value(curve: Iterable[Mapping[str, Any]], metric: str) -> float | None:
    vals = [v for v, _ in _metric_values(curve, metric)]
    return max(vals) if vals else None
