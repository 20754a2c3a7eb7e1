"""When a run is evaluated and which model is scored, off the training clock (DAWNBench's
rule): each ``train.eval_every_steps``-th step into the record's ``evals``, each
``train.eval_every``-th epoch into the curve; under an outer sync the global model, right
after a synchronisation (docs/internals/train.md)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from bench.data.loaders import SAMPLES
from bench.results import columns as col
from bench.results.timing import reached
from bench.train import runtime
from bench.train.state import TrainState


def after_step(s: TrainState, last: bool) -> tuple[float, bool]:
    """After each step but the epoch's last: (wall time in s of its evaluation or kept model,
    off the clock; whether it reached the target)."""
    s.at_sync = s.sync.synced()
    t = s.cfg.train
    n = t.eval_every_steps
    if last or s.status == "diverged" or s.step < t.eval_from_step:
        return 0.0, False
    s.pending = s.pending or (n > 0 and s.step % n == 0)
    if not (s.pending and s.at_sync):
        return 0.0, False
    s.pending = False
    s.clock.pause()
    t0 = time.perf_counter()
    hit = False
    if t.eval_stride > 1 and (s.step // n) % t.eval_stride:  # kept for :func:`_backfill`
        s.kept.append((_point(s), s.sync.global_state(s.model) or _copy(s.model.state_dict())))
    else:
        hit = _evaluate(s, _point(s), s.sync.global_state(s.model))
        if hit:
            _backfill(s)
        s.kept = []
        s.ddp.train()
    dt = time.perf_counter() - t0
    s.clock.resume()
    s.timer.restart()  # the evaluation is no step phase
    return dt, hit


def after_epoch(s: TrainState, row: dict[str, Any]) -> dict[str, float]:
    """The epoch's evaluation when due, as curve columns ({}: none)."""
    if not _epoch_due(s, row):
        return {}
    if not s.at_sync:  # an outer sync between two synchronisations: the next one scores
        s.pending = True
        return {}
    s.pending = False
    s.mllog.eval_start(s.epoch + 1)
    state = s.sync.global_state(s.model)
    ev = _metrics(s, state)
    metric = s.cfg.train.target_metric
    samples = _eval_samples(s) if s.mllog.wants_eval_samples else None  # all ranks: once
    s.mllog.eval_stop(s.epoch + 1, metric, float(ev[metric]), samples)
    out = {col.metric_column(k): v for k, v in ev.items()}
    if state is not None:  # the global model's: a point of the record too
        s.evals.append({**_point(s), **out})
    if reached(out.get(col.metric_column(metric)), s.cfg.train.target_value):
        _backfill(s)
    s.kept = []
    return out


def _epoch_due(s: TrainState, row: dict[str, Any]) -> bool:
    if s.status == "diverged" or not math.isfinite(row[col.TRAIN_LOSS]):
        return False  # a diverged model is not evaluated
    last = s.epoch + 1 == s.cfg.train.epochs
    if s.step < s.cfg.train.eval_from_step and not last:
        return False  # train.eval_from_step: too early to reach the target
    return (s.epoch + 1) % s.cfg.train.eval_every == 0 or last


def _point(s: TrainState) -> dict[str, Any]:
    point = {"step": s.step, col.EPOCH: s.epoch + 1, col.TRAIN_TIME: s.clock.elapsed}
    return {**point, "scored": "global", "outer_syncs": s.sync.syncs()} if s.sync.outer else point


def _copy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


def _metrics(s: TrainState, state: dict[str, torch.Tensor] | None) -> dict[str, float]:
    """The held-out metrics of ``state`` (None: the model as it is); the model put back."""
    now = None
    if state is not None:
        now = _copy(s.model.state_dict())
        s.model.load_state_dict(state)
    if not s.sync.outer:  # DDP: every rank with rank 0's BN statistics
        runtime.broadcast_buffers(s.model)
    ev = s.workload.evaluate(s.model, s.workload.data.eval, s.autocast)
    if now is not None:
        s.model.load_state_dict(now)
    return ev


def _evaluate(s: TrainState, point: dict[str, Any], state: Any = None) -> bool:
    """Score ``state`` into ``point``, appended to ``s.evals``; whether it reached the target."""
    point = {**point, **{col.metric_column(k): v for k, v in _metrics(s, state).items()}}
    s.evals.append(point)
    return reached(
        point.get(col.metric_column(s.cfg.train.target_metric)), s.cfg.train.target_value
    )


def _backfill(s: TrainState) -> None:
    """Evaluate the kept models oldest first, up to the first at the target (every rank)."""
    kept, s.kept = s.kept, []
    for point, state in kept:
        if _evaluate(s, point, state):
            break
    s.evals.sort(key=lambda e: e["step"])
    s.ddp.train()


def _eval_samples(s: TrainState) -> int:
    """Every rank: the evaluation's samples, summed over the ranks."""
    mine = s.workload.data.eval.epoch_stats().get(SAMPLES, 0)
    total = torch.tensor([float(mine)], dtype=torch.float64, device=s.device)
    return int(runtime.all_reduce_sum(total).item())
