"""Time to target by epochs alone: only the tests use it (the library counts sub-epoch
evaluations too, :func:`bench.results.timing.time_to_target_steps`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from bench.results.timing import time_to_target_steps


def time_to_target(
    curve: Iterable[Mapping[str, Any]], metric: str, target: float
) -> tuple[float | None, int | None]:
    """(training time, epoch) of the first evaluation at or above ``target``; (None, None)."""
    tt, epoch, _ = time_to_target_steps(list(curve), (), metric, target)
    return tt, epoch
