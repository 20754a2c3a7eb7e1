"""Evaluations inside an epoch (``train.eval_every_steps``): time to target resolved to a
few optimizer steps instead of an epoch.  The training clock is paused around each (they
are not training time, as DAWNBench's rule says: ``bench/results/timing.py``); the
points go to ``TrainState.evals`` and the record's ``evals``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from bench.results import columns as col
from bench.results.timing import reached
from bench.train import runtime

if TYPE_CHECKING:
    from bench.train.loop import TrainState


def step_eval_due(s: TrainState, last: bool) -> bool:
    """After this step, a sub-epoch evaluation?  Not after the epoch's last step, which
    the epoch's own evaluation follows."""
    n = s.cfg.train.eval_every_steps
    return n > 0 and not last and s.step % n == 0 and s.status != "diverged"


def step_evaluate(s: TrainState) -> tuple[float, bool]:
    """Evaluate inside an epoch with the training clock paused; append the point to
    ``s.evals``.  Returns (its wall time in s, whether it reached the target)."""
    s.clock.pause()
    t = time.perf_counter()
    runtime.broadcast_buffers(s.model)
    ev = s.workload.evaluate(s.model, s.workload.data.eval, s.autocast)
    point = {
        "step": s.step,
        col.EPOCH: s.epoch + 1,
        col.TRAIN_TIME: s.clock.elapsed,
        **{col.metric_column(k): v for k, v in ev.items()},
    }
    s.evals.append(point)
    s.ddp.train()
    dt = time.perf_counter() - t
    s.clock.resume()
    s.timer.restart()  # the evaluation is no step phase
    metric = col.metric_column(s.cfg.train.target_metric)
    return dt, reached(point.get(metric), s.cfg.train.target_value)
