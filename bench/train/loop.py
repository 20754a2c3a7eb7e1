"""The data-parallel training loop (one process per worker).

Started by a launcher (:mod:`bench.cluster.launch`) through torch.distributed's elastic
agent; entry points ``python -m bench.train --config run.json`` and :func:`train`.

One :class:`TrainState` holds everything a worker's run is built from and everything
that changes while it trains; :func:`setup` builds it, :func:`train_epoch` and
:func:`evaluate` advance it, :func:`finish` closes it and (rank 0) writes the record.

Per step, the phases are timed: ``data`` (waiting for the next batch), ``compute``
(forward and backward, including DDP's gradient communication, which overlaps the
backward pass), ``update`` (optimizer step); the communication library adds its own
selection and communication times.  Training time follows :mod:`bench.results.timing`.
Rank 0 writes the run record, the per-epoch curve and the time-to-accuracy plot.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from bench.comm import is_sparse
from bench.config import Config, from_container, to_container
from bench.data.types import RANK_TOKENS
from bench.optim import after_ddp_broadcast, build_optimizer, build_scheduler, ddp_kwargs
from bench.results import columns as col
from bench.results import dawnbench, records
from bench.results.divergence import exploded
from bench.results.events import events_path, read_events, restarts
from bench.results.mllog import RunLog
from bench.results.outputs import closing_lines
from bench.results.plots import plot_time_to_accuracy
from bench.results.timing import TrainClock, reached
from bench.train import checkpoint, runtime
from bench.train import checkpoint as ck
from bench.train.checkpoint import resume
from bench.train.comm import attach
from bench.train.console import table_header, table_row
from bench.train.step_eval import step_eval_due, step_evaluate
from bench.train.workload import WORKLOADS


@dataclass
class TrainState:
    """One worker's run: what it is built from, and all that changes during training.

    The changing part (model and optimizer tensors, scheduler, scaler, the comm hook's
    residuals inside ``comm``, ``clock``, ``curve``, ``epoch``, ``step``, ``status``) is
    what a checkpoint must save.  The sampler position is ``epoch``: loaders derive their
    order from (seed, epoch); the global torch generator is seeded once in :func:`setup`.
    """

    cfg: Config
    run: dict[str, Any]  # run id, start time, launch time, experiment (rank 0's)
    rank: int
    world: int
    nnodes: int
    device: torch.device
    workload: Any  # bench.train.workload.Workload: data, model, loss, evaluate
    model: nn.Module  # the bare model (evaluation, checkpoints)
    ddp: nn.Module  # what trains: the DDP wrapper, or the model in a single process
    optimizer: torch.optim.Optimizer
    scheduler: Any  # torch LR scheduler, stepped once per optimizer step
    comm: Any  # bench.comm.CommController: warm-up, density schedule, statistics
    autocast: Callable[[], Any]
    scaler: torch.amp.GradScaler | None
    steps: int  # optimizer steps per epoch
    timer: runtime.PhaseTimer
    clock: TrainClock = field(default_factory=TrainClock)
    curve: list[dict[str, Any]] = field(default_factory=list)
    epoch: int = 0  # epochs completed (the next epoch's 0-based index)
    step: int = 0  # optimizer steps completed
    status: str = "target_missed"
    diverged_at: dict[str, Any] | None = None  # step, epoch and place of the first NaN/Inf
    # sub-epoch evaluations (train.eval_every_steps): step, epoch, training time, metrics
    evals: list[dict[str, Any]] = field(default_factory=list)
    mllog: RunLog = field(default_factory=lambda: RunLog(None))  # rank 0's MLPerf log


def setup(payload: dict[str, Any]) -> TrainState:
    """Process group, workload, optimizer, DDP and its communication hook, from the run JSON."""

    cfg = from_container(payload["config"])
    rank, world, device = runtime.setup_distributed(cfg)
    run = runtime.broadcast_object(dict(payload["run"]))  # one run id and launch time
    torch.manual_seed(cfg.train.seed)
    workload = WORKLOADS.get(cfg.train.workload)(cfg, rank, world, device)
    model = workload.model.to(device)
    if device.type == "cuda" and cfg.model.channels_last:
        model = model.to(memory_format=torch.channels_last)
    steps = _steps_per_epoch(len(workload.data.train), cfg.train.max_steps_per_epoch, rank)
    optimizer = build_optimizer(model, cfg.optim)
    ddp = _wrap(model, optimizer, cfg, device)
    after_ddp_broadcast(optimizer)  # fp32 masters follow the model DDP just broadcast
    autocast, scaler = runtime.amp_context(cfg.train.amp, device)
    s = TrainState(
        cfg=cfg,
        run=run,
        rank=rank,
        world=world,
        nnodes=runtime.node_count(world),
        device=device,
        workload=workload,
        model=model,
        ddp=ddp,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, cfg.optim, steps, cfg.train.epochs),
        comm=attach(ddp, cfg.comm, steps_per_epoch=steps),
        autocast=autocast,
        scaler=scaler,
        steps=steps,
        timer=runtime.PhaseTimer(device, cfg.train.time_phases),
    )
    if hasattr(s.comm.state, "nan_check"):
        s.comm.state.nan_check = cfg.train.nan_check == "step"

    resume(s)  # after an elastic restart or by hand: from the run's last checkpoint
    return s


def _steps_per_epoch(batches: int, max_steps: int, rank: int) -> int:
    steps = min(batches, max_steps) if max_steps > 0 else batches
    if steps < 1:
        raise RuntimeError(
            f"an epoch has no training step on rank {rank}: the data set is smaller than one batch"
        )
    return steps


def _wrap(model: nn.Module, optimizer: Any, cfg: Config, device: torch.device) -> nn.Module:
    """DDP around the model (its constructor broadcasts rank 0's weights), or the model alone."""

    if not dist.is_initialized():
        return model
    return DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=cfg.comm.bucket_cap_mb,
        **ddp_kwargs(optimizer),  # update modes that own the gradient buffer
    )


def train_step(s: TrainState, batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Forward, backward (DDP communicates), update; returns (loss, correct predictions),
    or None when a NaN/Inf was found (the update is skipped, ``s.status`` is diverged)."""
    with s.autocast():
        loss, correct = s.workload.loss(s.ddp, batch)
    if _inject_nan(s):
        loss = loss * float("nan")
    (s.scaler.scale(loss) if s.scaler is not None else loss).backward()
    s.timer.mark("compute")
    if s.cfg.train.nan_check == "step" and _diverged(s, loss):
        s.optimizer.zero_grad(set_to_none=False)
        return None
    if s.cfg.optim.clip_norm > 0:
        runtime.clip_gradients(s.model, s.optimizer, s.scaler, s.cfg.optim.clip_norm)
    if s.scaler is not None:
        s.scaler.step(s.optimizer)
        s.scaler.update()
    else:
        s.optimizer.step()
    # every update mode: p.grad are views into DDP's buckets; zero them, never drop them
    s.optimizer.zero_grad(set_to_none=False)
    s.scheduler.step()
    s.timer.mark("update")
    s.step += 1
    return loss.detach(), correct


def _inject_nan(s: TrainState) -> bool:
    """Fault injection for tests: BENCH_FAULT_NAN_STEP=N makes rank 0's loss NaN at step N."""
    return s.rank == 0 and os.environ.get("BENCH_FAULT_NAN_STEP") == str(s.step + 1)


def _diverged(s: TrainState, loss: torch.Tensor) -> bool:
    """Whether this step's reduced gradient (or, without a comm hook, any gradient) holds
    a NaN or Inf; notes where in ``s.diverged_at``.  The reduced buckets are the same on
    every rank, so every rank stops at the same step."""
    hook = s.comm.state
    if getattr(hook, "nan_check", False):
        # the hooks' device flags (reduced buckets, and the inputs of sparse selections):
        # one read here per step, none inside the hooks
        found = hook.take_finite()
        if not found or bool(torch.stack([ok for _, ok in found]).all()):
            return False
        bad = [i for i, ok in found if not bool(ok)]
        where = (
            f"gradient bucket {bad[0]} after decompression"
            if bad[0] >= 0
            else "a sparse selection's input (gradient plus residual)"
        )
    else:
        grads = [(n, p.grad) for n, p in s.model.named_parameters() if p.grad is not None]
        if not grads or bool(torch.stack([g.sum().float() for _, g in grads]).sum().isfinite()):
            return False
        where = f"gradient of {next(n for n, g in grads if not bool(g.sum().isfinite()))}"
    if not bool(torch.isfinite(loss)):
        where = f"loss (then {where})"
    s.status = "diverged"
    s.diverged_at = {"step": s.step + 1, "epoch": s.epoch + 1, "where": where}
    return True


def train_epoch(s: TrainState) -> dict[str, Any]:
    """One epoch of ``s.steps`` steps; returns its curve columns (summed over workers)."""
    loader = s.workload.data.train
    loader.set_epoch(s.epoch)
    s.comm.set_epoch(s.epoch)
    s.ddp.train()
    sums = torch.zeros(2, dtype=torch.float64, device=s.device)  # loss, correct predictions
    samples = 0  # real samples of this rank (batch labels), counted on the host
    bar = _progress(s)
    s.clock.start()
    t0 = time.perf_counter()
    s.timer.restart()
    it = iter(loader)
    steps = 0
    eval_s = 0.0  # sub-epoch evaluations: wall time inside the epoch, not training time
    for i in range(s.steps):
        batch = next(it)
        s.timer.mark("data")
        out = train_step(s, batch)
        if out is None:  # diverged: this step's gradient never reaches the model
            sums += float("nan")
            break
        sums += torch.stack([out[0].double(), out[1].double()])
        samples += len(batch[1])
        steps += 1
        _show_step(bar, out[0], samples * s.world, t0 + eval_s)  # every worker: as many per step
        if step_eval_due(s, last=i == s.steps - 1):
            dt, hit = step_evaluate(s)
            eval_s += dt
            if hit and s.cfg.train.stop_at_target:
                break  # every rank: the metrics are reduced, so all stop at this step
    del it
    epoch_s = time.perf_counter() - t0 - eval_s
    s.clock.pause()
    bar.close()
    return _epoch_row(s, loader.epoch_stats(), sums, samples, steps, epoch_s)


def _epoch_row(
    s: TrainState,
    stats: dict[str, Any],
    sums: torch.Tensor,
    samples: int,
    steps: int,
    epoch_s: float,
) -> dict[str, Any]:
    """The epoch's curve columns: this rank's loader counts, every worker's totals."""
    # token-batched loaders also count source + target tokens (this rank's; summed below)
    tokens = stats.get(RANK_TOKENS)
    extra = [] if tokens is None else [float(tokens)]
    skipped = float(stats.get("data/corrupt", 0))  # this rank's damaged images (loaders)
    counts = torch.cat([sums, sums.new_tensor([samples, skipped, *extra])])
    loss_sum, correct, samples, skipped, *total_tokens = runtime.all_reduce_sum(counts).tolist()
    phases = s.timer.pop()
    return {
        # the loader's own counts are this rank's; the totals below are every worker's
        **stats,
        **_token_columns(total_tokens, epoch_s),
        **s.comm.pop_stats(),
        col.EPOCH: s.epoch + 1,
        col.TRAIN_TIME: s.clock.elapsed,
        col.EPOCH_TIME: epoch_s,
        col.TRAIN_LOSS: loss_sum / (max(1, steps) * s.world),
        col.TRAIN_TOP1: correct / max(1.0, samples),
        col.SAMPLES: int(samples),
        col.STEPS: steps,
        col.SKIPPED: int(skipped),
        col.THROUGHPUT: samples / epoch_s,
        col.DATA_SHARE: phases.get("data", 0.0) / epoch_s,
        **{f"time/{k}_s": v / max(1, steps) for k, v in phases.items()},
        col.LR: s.scheduler.get_last_lr()[0],
    }


def _token_columns(total: list[float], epoch_s: float) -> dict[str, float]:
    """Every worker's source + target tokens of the epoch and their rate (token loaders)."""
    if not total:
        return {}
    return {col.TOKENS: int(total[0]), col.TOKEN_THROUGHPUT: total[0] / epoch_s}


def _progress(s: TrainState) -> Any:
    """Rank 0's bar over the epoch's steps, on a terminal only: in a log file or a pipe
    its redraws would be noise between the per-epoch rows."""
    show = s.rank == 0 and s.cfg.train.progress and sys.stderr.isatty()
    return tqdm(
        total=s.steps,
        desc=f"epoch {s.epoch + 1}",
        unit="step",
        leave=False,
        dynamic_ncols=True,
        disable=not show,
        file=sys.stderr,
    )


def _show_step(bar: Any, loss: torch.Tensor, samples: int, t0: float) -> None:
    """The bar's step, with the samples/s of all workers (as in the epoch's row) and the
    step's mean loss (this rank's).  Reading the loss synchronises with the device, so it
    is read only for a bar that is shown, and at most twice a second."""
    bar.update(1)
    if bar.disable or time.perf_counter() - getattr(bar, "_shown_at", 0.0) < 0.5:
        return
    bar._shown_at = time.perf_counter()
    rate = samples / max(1e-9, time.perf_counter() - t0)
    bar.set_postfix_str(f"loss {float(loss):.3f}, {rate:.0f} samples/s", refresh=False)


def evaluate(s: TrainState) -> dict[str, float]:
    """Held-out metrics as curve columns, every rank with rank 0's BN statistics."""
    s.mllog.eval_start(s.epoch + 1)
    runtime.broadcast_buffers(s.model)
    ev = s.workload.evaluate(s.model, s.workload.data.eval, s.autocast)
    s.mllog.eval_stop(s, ev)  # every rank: the first evaluation's samples are summed
    return {col.metric_column(k): v for k, v in ev.items()}


def end_epoch(
    s: TrainState, row: dict[str, Any], evaluated: dict[str, float], eval_s: float
) -> bool:
    """Append the epoch's row to the curve and settle the status; True to go on."""
    metric, target = s.cfg.train.target_metric, s.cfg.train.target_value
    not_evaluated = {col.metric_column(m): float("nan") for m in s.workload.metrics}
    row = {**row, col.EVAL_TIME: eval_s, **not_evaluated, **evaluated}
    s.curve.append(row)
    s.epoch += 1
    if s.rank == 0:
        print(table_row(s, row), flush=True)
        records.write_curve(s.cfg.results.dir, s.run["run_id"], s.curve, extend=True)
    check = s.cfg.train.nan_check != "off"
    if s.status == "diverged" or (check and not math.isfinite(row[col.TRAIN_LOSS])):
        s.status = "diverged"
        s.diverged_at = s.diverged_at or {"step": s.step, "epoch": s.epoch, "where": "loss"}
        return False
    grown = exploded([r[col.TRAIN_LOSS] for r in s.curve]) if check else None
    if grown:  # finite, but orders of magnitude up: diverged too (bench.results.divergence)
        s.status = "diverged"
        s.diverged_at = {"step": s.step, "epoch": s.epoch, "where": "loss", "reason": grown}
        return False
    mcol = col.metric_column(metric)
    fine = any(reached(e.get(mcol), target) for e in s.evals if e[col.EPOCH] == s.epoch)
    if fine or reached(evaluated.get(mcol), target):
        s.status = "ok"
        if s.cfg.train.stop_at_target:
            return False
    return s.epoch < s.cfg.train.epochs


def _eval_due(s: TrainState, row: dict[str, Any]) -> bool:
    if s.status == "diverged" or not math.isfinite(row[col.TRAIN_LOSS]):
        return False  # a diverged model is not evaluated
    return (s.epoch + 1) % s.cfg.train.eval_every == 0 or s.epoch + 1 == s.cfg.train.epochs


def finish(s: TrainState, leave_group: bool = True) -> dict[str, Any] | None:
    """Stop the loaders, write the outputs (rank 0), leave the process group (a queue of
    runs keeps it for the next run: :mod:`bench.launch.runqueue`)."""

    for loader in (s.workload.data.train, s.workload.data.eval):
        if hasattr(loader, "close"):  # loader workers and DALI pipelines stop now, not at exit
            loader.close()
    record = write_outputs(s).to_dict() if s.rank == 0 else None
    if dist.is_initialized():
        dist.barrier()
        if leave_group:
            dist.destroy_process_group()
    return record


def write_outputs(s: TrainState) -> records.RunRecord:
    """Rank 0: the curve CSV, the time-to-accuracy figure and the run's record."""

    cfg, res = s.cfg, s.cfg.results.dir
    rec = records.RunRecord.start(
        cfg,
        s.run,
        config=to_container(cfg),
        comm_sparse=is_sparse(cfg.comm.name),
        nnodes=s.nnodes,
    ).finish(
        s.curve,
        status=s.status,
        train_time_s=s.clock.elapsed,
        world_size=s.world,
        launch_time=s.run["launch_time"],
        evals=s.evals,
    )
    _outcome(s, rec)
    link = os.environ.get("BENCH_LINK_CHECK")
    if link and Path(link).is_file():
        rec.link_check = json.loads(Path(link).read_text())
    rec.curve = str(records.write_curve(res, rec.run_id, s.curve, extend=True))
    rec.mllog = s.mllog.run_stop(s.status)
    rec.dawnbench_json, rec.dawnbench_tsv = dawnbench.write(res, rec.to_dict(), s.curve)
    if hasattr(s.workload, "write_translations"):  # translation: the last decoded output
        rec.translations = s.workload.write_translations(res, rec.run_id)
    if cfg.results.plot and s.curve:
        rec.figure = str(_plot(s, rec))
    try:
        rec.append(res)
    except records.AlreadyRecorded as e:  # restarted after the record was written
        print(f"record kept as it was: {e}", flush=True)
    tt = rec.time_to_target_s
    tts = f"{tt:.1f} s (epoch {rec.epochs_to_target})" if tt is not None else "not reached"
    print(
        f"status {rec.status}; time to {100 * rec.target_value:g} % {rec.target_metric}: {tts}; "
        f"training time {rec.train_time_s:.1f} s",
        flush=True,
    )
    print(closing_lines(rec.to_dict(), res), flush=True)
    return rec


def _outcome(s: TrainState, rec: records.RunRecord) -> None:
    """Restarts, last checkpoint and divergence into the record."""

    rec.restarts = restarts(read_events(events_path(s.cfg.results.dir, rec.run_id)))
    last = ck.latest(s.cfg.results.dir, rec.run_id)
    rec.checkpoint = last["path"] if last else None
    if s.diverged_at is not None:
        rec.diverged_at = s.diverged_at
        d = s.diverged_at
        rec.reason = f"NaN/Inf at step {d['step']} (epoch {d['epoch']}) in the {d['where']}"
        if d.get("reason"):
            rec.reason = f"{d['reason']} in epoch {d['epoch']}"


def _plot(s: TrainState, rec: records.RunRecord) -> Path:

    return plot_time_to_accuracy(
        [(f"{rec.model} {rec.comm} x{rec.world_size}", pd.DataFrame(s.curve))],
        metric=rec.target_metric,
        target=rec.target_value,
        path=Path(s.cfg.results.dir) / "figures" / f"{rec.run_id}_tta.png",
        hardware=rec.hardware,
        title=f"{rec.experiment}: time to {100 * rec.target_value:g} % {rec.target_metric} "
        f"({rec.run_id})",
    )


def train(payload: dict[str, Any], leave_group: bool = True) -> dict[str, Any] | None:
    """Run one training job in this worker; rank 0 returns (and writes) the record."""

    init_start = time.time()
    s = setup(payload)
    cfg = s.cfg
    s.mllog = RunLog.open(cfg.results.dir, s.run["run_id"], s.rank)
    if s.rank == 0:
        print(
            f"run {s.run['run_id']}: {cfg.model.name} on {cfg.data.name}, {s.world} workers "
            f"({s.nnodes} node(s)), comm={cfg.comm.name}, update={cfg.optim.update}, "
            f"target {cfg.train.target_metric} >= {cfg.train.target_value}",
            flush=True,
        )
        print(table_header(s), flush=True)
    if dist.is_initialized():
        dist.barrier()
    stopped = s.status == "ok" and cfg.train.stop_at_target  # resumed from the last checkpoint
    go_on = s.epoch < cfg.train.epochs and not stopped
    s.mllog.begin(s, init_start)
    while go_on:
        s.mllog.epoch_start(s.epoch + 1)
        row = train_epoch(s)
        s.mllog.epoch_stop(s.epoch + 1, row[col.SAMPLES])
        t_eval = time.perf_counter()
        evaluated = evaluate(s) if _eval_due(s, row) else {}
        go_on = end_epoch(s, row, evaluated, time.perf_counter() - t_eval)
        _checkpoint(s, last=not go_on)
    return finish(s, leave_group)


def _checkpoint(s: TrainState, last: bool) -> None:
    """Every rank: a checkpoint every ``train.checkpoint_every`` epochs and at the end
    (not of a diverged model); its time is not training time (the clock is paused)."""

    every = s.cfg.train.checkpoint_every
    if every <= 0 or s.status == "diverged" or not (last or s.epoch % every == 0):
        return
    checkpoint.save(s, barrier=runtime.barrier)
