"""The data-parallel training loop, one process per worker: :func:`train` builds a
:class:`~bench.train.state.TrainState` (:func:`setup`), trains it epoch by epoch
(:func:`train_epoch`, :func:`train_step`), evaluates it, checkpoints it, and rank 0
writes the run's record and outputs (:func:`write_outputs`).  Each step is timed in
phases (data, compute, update); training time follows :mod:`bench.results.timing`.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.cluster.emulated import LinkClock, link_bytes
from bench.comm import is_sparse
from bench.config import Config, from_container, to_container
from bench.data.loaders import RANK_TOKENS, SAMPLES
from bench.optim import after_ddp_broadcast, build_optimizer, build_scheduler, ddp_kwargs
from bench.results import columns as col
from bench.results import records
from bench.results.divergence import exploded
from bench.results.mllog import RunLog
from bench.results.outputs import closing_lines
from bench.results.plots import plot_time_to_accuracy
from bench.results.timing import reached
from bench.train import checkpoint as ck
from bench.train import runtime
from bench.train.comm import attach
from bench.train.progress import epoch_bar, machine_load, show_step, watch_load
from bench.train.state import TrainState
from bench.train.sync import OuterSync
from bench.train.workload import WORKLOADS


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
    outer = OuterSync(cfg, rank, world)  # sync=ddp: None, the world is DDP's group
    ddp = _wrap(model, optimizer, cfg, device, outer.group)
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
        comm=attach(
            ddp, cfg.comm, steps_per_epoch=steps, optimizer=optimizer, process_group=outer.group
        ),
        autocast=autocast,
        scaler=scaler,
        steps=steps,
        timer=runtime.PhaseTimer(device, cfg.train.time_phases),
        clock=LinkClock.of_worker(),  # an emulated node's link bytes while it trains
    )
    if hasattr(s.comm.state, "nan_check"):
        s.comm.state.nan_check = cfg.train.nan_check == "step"
    s.sync = outer.start(model, optimizer, getattr(s.comm.state, "stats", None), device)
    checkpoints(s).resume()  # after an elastic restart or by hand: from its last checkpoint
    s.clock.steps_from = s.step  # type: ignore[attr-defined]  (a LinkClock, above)
    return s


def checkpoints(s: TrainState) -> ck.CheckpointManager:
    """The run's checkpoints: what rank 0 saves, each rank's hook, ``s``'s progress."""
    states = {"model": s.model, "optimizer": s.optimizer, "scheduler": s.scheduler}
    return ck.CheckpointManager(
        s.cfg,
        s.run,
        rank=s.rank,
        world=s.world,
        device=s.device,
        states={**states, "scaler": s.scaler},  # common.pt's keys, in this order
        hook=s.comm.state,  # one process has no hook: a stand-in without state
        progress=s,
        replica=s.sync.state,
    )


def _steps_per_epoch(batches: int, max_steps: int, rank: int) -> int:
    steps = min(batches, max_steps) if max_steps > 0 else batches
    if steps < 1:
        raise RuntimeError(
            f"an epoch has no training step on rank {rank}: the data set is smaller than one batch"
        )
    return steps


def _wrap(
    model: nn.Module, optimizer: Any, cfg: Config, device: torch.device, group: Any = None
) -> nn.Module:
    """DDP around the model over ``group`` (None: the world; its constructor broadcasts the
    group's first weights), or the model alone."""
    if not dist.is_initialized():
        return model
    return DDP(
        model,
        process_group=group,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=cfg.comm.bucket_cap_mb,
        # not rank 0's BatchNorm buffers at every forward: training uses the batch's
        # statistics, rank 0 keeps its own either way, and the evaluation and checkpoints
        # take rank 0's (runtime.broadcast_buffers); sent each step, they were link bytes
        # no method counted (4.5 kB a step on the digits' ResNet-9, 18 % of DeMo's packet)
        **runtime.NO_BUFFER_SYNC,
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
    """Whether this step's reduced gradient (without a comm hook: any gradient) holds a
    NaN or Inf; notes where in ``s.diverged_at``."""
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
    bar = epoch_bar(s)
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
        show_step(bar, out[0], samples * s.world, t0 + eval_s)  # every worker: as many per step
        if _step_eval_due(s, last=i == s.steps - 1) and _strided_out(s):
            eval_s += _keep(s)
        elif _step_eval_due(s, last=i == s.steps - 1):
            dt, hit = _step_evaluate(s)
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
        # token loaders: every worker's source + target tokens and their rate
        **({col.TOKENS: int(total_tokens[0])} if total_tokens else {}),
        **({col.TOKEN_THROUGHPUT: total_tokens[0] / epoch_s} if total_tokens else {}),
        **s.comm.pop_stats(),
        **s.sync.pop_stats(),  # an outer sync's bytes are in comm/ too, per step
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


def _step_eval_due(s: TrainState, last: bool) -> bool:
    """A sub-epoch evaluation point after this step (``train.eval_every_steps``, from
    ``train.eval_from_step``)?  Not after the epoch's last step, which the epoch's own
    evaluation follows."""
    t = s.cfg.train
    n = t.eval_every_steps
    due = n > 0 and not last and s.step % n == 0 and s.status != "diverged"
    return due and s.step >= t.eval_from_step


def _strided_out(s: TrainState) -> bool:
    """With ``train.eval_stride`` k > 1, only every k-th evaluation point is evaluated;
    the others keep a copy of the model (:func:`_keep`) for :func:`_backfill`."""
    t = s.cfg.train
    return t.eval_stride > 1 and (s.step // t.eval_every_steps) % t.eval_stride != 0


def _point(s: TrainState) -> dict[str, Any]:
    return {"step": s.step, col.EPOCH: s.epoch + 1, col.TRAIN_TIME: s.clock.elapsed}


def _keep(s: TrainState) -> float:
    """Keep this step's model for a later evaluation, off the training clock; its wall
    time in s."""
    s.clock.pause()
    t = time.perf_counter()
    point = _point(s)
    state = {k: v.detach().clone() for k, v in s.model.state_dict().items()}
    s.kept.append((point, state))
    s.clock.resume()
    s.timer.restart()
    return time.perf_counter() - t


def _evaluate_point(s: TrainState, point: dict[str, Any]) -> bool:
    """Evaluate the model as it is, append ``point`` with its metrics to ``s.evals``;
    whether it reached the target."""
    runtime.broadcast_buffers(s.model, s.sync.node_root, s.sync.group)
    ev = s.workload.evaluate(s.model, s.workload.data.eval, s.autocast)
    point = {**point, **{col.metric_column(k): v for k, v in ev.items()}}
    s.evals.append(point)
    metric = col.metric_column(s.cfg.train.target_metric)
    return reached(point.get(metric), s.cfg.train.target_value)


def _backfill(s: TrainState) -> None:
    """An evaluation reached the target: evaluate the kept models oldest first, up to the
    first that reaches it too (every rank: the metrics are reduced, so all agree), then
    put the model back.  The first step at the target is then the one that evaluating
    every ``train.eval_every_steps`` steps would have found."""
    kept, s.kept = s.kept, []
    if not kept:
        return
    now = {k: v.detach().clone() for k, v in s.model.state_dict().items()}
    for point, state in kept:
        s.model.load_state_dict(state)
        if _evaluate_point(s, point):
            break
    s.model.load_state_dict(now)
    s.evals.sort(key=lambda e: e["step"])
    s.ddp.train()


def _step_evaluate(s: TrainState) -> tuple[float, bool]:
    """Evaluate inside an epoch with the training clock paused; append the point to
    ``s.evals`` (and, at the target, the kept models' points).  Returns (its wall time
    in s, whether it reached the target)."""
    s.clock.pause()
    t = time.perf_counter()
    hit = _evaluate_point(s, _point(s))
    if hit:
        _backfill(s)
    s.kept = []
    s.ddp.train()
    dt = time.perf_counter() - t
    s.clock.resume()
    s.timer.restart()  # the evaluation is no step phase
    return dt, hit


def evaluate(s: TrainState) -> dict[str, float]:
    """Held-out metrics as curve columns, every rank with rank 0's BN statistics."""
    s.mllog.eval_start(s.epoch + 1)
    runtime.broadcast_buffers(s.model, s.sync.node_root, s.sync.group)
    ev = s.workload.evaluate(s.model, s.workload.data.eval, s.autocast)
    metric = s.cfg.train.target_metric
    samples = _eval_samples(s) if s.mllog.wants_eval_samples else None  # all ranks: once
    s.mllog.eval_stop(s.epoch + 1, metric, float(ev[metric]), samples)
    return {col.metric_column(k): v for k, v in ev.items()}


def _eval_samples(s: TrainState) -> int:
    """Every rank: the samples of the evaluation just done, summed over the ranks."""
    mine = s.workload.data.eval.epoch_stats().get(SAMPLES, 0)
    total = torch.tensor([float(mine)], dtype=torch.float64, device=s.device)
    return int(runtime.all_reduce_sum(total).item())


def _shown(s: TrainState, metric: str) -> bool:
    """top-5 says nothing on a task of 10 classes or fewer (DAWNBench reports it for
    ImageNet only): not in the table there unless it is the target (still in the curve)."""
    if metric != "top5" or s.cfg.train.target_metric == "top5":
        return True
    classes = getattr(getattr(s.workload, "data", None), "num_classes", None)
    return classes is None or classes > 10


def _table(s: TrainState) -> list[tuple[str, str, int, str, float]]:
    """The per-epoch table rank 0 prints: (header, curve column, width, format, scale)."""
    metrics = [m for m in s.workload.metrics if m != "loss" and _shown(s, m)]
    return [
        ("epoch", col.EPOCH, 5, "d", 1),
        ("lr", col.LR, 8, ".4f", 1),
        ("train_loss", col.TRAIN_LOSS, 10, ".4f", 1),
        ("train_top1", col.TRAIN_TOP1, 9, ".2f", 100),
        *[(f"{m}%", col.metric_column(m), 8, ".2f", 100) for m in metrics],
        ("train_s", col.TRAIN_TIME, 10, ".2f", 1),
        ("epoch_s", col.EPOCH_TIME, 8, ".2f", 1),
        ("samples/s", col.THROUGHPUT, 9, ".1f", 1),
        ("data%", col.DATA_SHARE, 6, ".1f", 100),
    ]


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
        print(" ".join(format(row[k] * sc, f">{w}{f}") for _, k, w, f, sc in _table(s)), flush=True)
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
    last = s.epoch + 1 == s.cfg.train.epochs
    if s.step < s.cfg.train.eval_from_step and not last:
        return False  # train.eval_from_step: too early to reach the target
    return (s.epoch + 1) % s.cfg.train.eval_every == 0 or s.epoch + 1 == s.cfg.train.epochs


def finish(s: TrainState, leave_group: bool = True) -> dict[str, Any] | None:
    """Stop the loaders, write the outputs (rank 0), leave the process group (a queue of
    runs keeps it)."""
    for loader in (s.workload.data.train, s.workload.data.eval):
        if hasattr(loader, "close"):  # loader workers and DALI pipelines stop now, not at exit
            loader.close()
    s.sync.close()  # the outer sync's Manager, then the Lighthouse (every rank takes part)
    links = _link_readings(s)
    record = write_outputs(s, links).to_dict() if s.rank == 0 else None
    if dist.is_initialized():
        dist.barrier()
        if leave_group:
            dist.destroy_process_group()
    return record


def _link_readings(s: TrainState) -> list[Any]:
    """Every worker's link counters (each emulated node's first worker reads its own)."""
    mine = s.clock.reading() if isinstance(s.clock, LinkClock) else None
    if not dist.is_initialized():
        return [mine]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def write_outputs(s: TrainState, links: list[Any] | None = None) -> records.RunRecord:
    """Rank 0: the curve CSV, the time-to-accuracy figure and the run's record (``links``:
    every worker's link counters, :class:`~bench.cluster.emulated.LinkClock`)."""
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
    if s.diverged_at is not None:
        d = rec.diverged_at = s.diverged_at
        rec.reason = f"NaN/Inf at step {d['step']} (epoch {d['epoch']}) in the {d['where']}"
        if d.get("reason"):
            rec.reason = f"{d['reason']} in epoch {d['epoch']}"
    link = os.environ.get("BENCH_LINK_CHECK")
    if link and Path(link).is_file():
        rec.link_check = json.loads(Path(link).read_text())
    since = s.clock.steps_from if isinstance(s.clock, LinkClock) else 0
    rec.link_bytes = link_bytes(links or [], s.step - since, rec.comm_inter_node_bytes_per_step)
    rec.machine_load = machine_load(rec.run_id)
    rec.curve = str(records.write_curve(res, rec.run_id, s.curve, extend=True))
    last = ck.latest(res, rec.run_id)
    records.settle(
        rec,
        res,
        s.curve,
        checkpoint=last["path"] if last else None,
        mllog=lambda: s.mllog.run_stop(s.status),
    )
    if hasattr(s.workload, "write_translations"):  # translation: the last decoded output
        rec.translations = s.workload.write_translations(res, rec.run_id)
    if cfg.results.plot and s.curve and (cfg.results.plot_sweeps or not cfg.results.sweep_id):
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


def _plot(s: TrainState, rec: records.RunRecord) -> Path:

    return plot_time_to_accuracy(
        [(f"{rec.model} {rec.comm} x{rec.world_size}", pd.DataFrame(s.curve))],
        metric=rec.target_metric,
        target=rec.target_value,
        path=records.figure_path(s.cfg.results.dir, rec.run_id),
        hardware=rec.hardware,
        title=f"{rec.experiment}: time to {100 * rec.target_value:g} % {rec.target_metric} "
        f"({rec.run_id})",
    )


def train(payload: dict[str, Any], leave_group: bool = True) -> dict[str, Any] | None:
    """Run one training job in this worker; rank 0 returns (and writes) the record."""
    init_start = time.time()
    watch_load(payload)  # a busy machine is named before the run sets up
    s = setup(payload)
    cfg = s.cfg
    s.mllog = RunLog.open(cfg.results.dir, s.run["run_id"], s.rank)
    if s.rank == 0:
        print(
            f"run {s.run['run_id']}: {cfg.model.name} on {cfg.data.name}, {s.world} workers "
            f"({s.nnodes} node(s)), comm={cfg.comm.name}, sync={cfg.sync.name}, "
            f"update={cfg.optim.update}, "
            f"target {cfg.train.target_metric} >= {cfg.train.target_value}",
            flush=True,
        )
        print(" ".join(f"{name:>{w}}" for name, _, w, _, _ in _table(s)), flush=True)
    if dist.is_initialized():
        dist.barrier()
    stopped = s.status == "ok" and cfg.train.stop_at_target  # resumed from the last checkpoint
    go_on = s.epoch < cfg.train.epochs and not stopped
    s.mllog.begin(
        cfg,
        world=s.world,
        nnodes=s.nnodes,
        steps_per_epoch=s.steps,
        train_samples=int(s.workload.data.train_samples),
        first_epoch=s.epoch + 1,
        init_start_s=init_start,
    )
    while go_on:
        s.mllog.epoch_start(s.epoch + 1)
        row = train_epoch(s)
        s.mllog.epoch_stop(s.epoch + 1, row[col.SAMPLES])
        t_eval = time.perf_counter()
        evaluated = evaluate(s) if _eval_due(s, row) else {}
        metric = col.metric_column(s.cfg.train.target_metric)
        if reached(evaluated.get(metric), s.cfg.train.target_value):
            _backfill(s)  # train.eval_stride: the kept models before this evaluation
        s.kept = []
        go_on = end_epoch(s, row, evaluated, time.perf_counter() - t_eval)
        _checkpoint(s, last=not go_on)
        _hold_epoch(go_on)
    return finish(s, leave_group)


def _hold_epoch(go_on: bool) -> None:
    """Fault injection for tests: BENCH_FAULT_EPOCH_HOLD_S=X holds every rank X s after
    each epoch's checkpoint but the last (a run lasts long enough for a fault to land in
    it, however fast this machine trains), outside every measured time."""
    hold = os.environ.get("BENCH_FAULT_EPOCH_HOLD_S")
    if hold and go_on:
        time.sleep(float(hold))


def _checkpoint(s: TrainState, last: bool) -> None:
    """Every rank: a checkpoint every ``train.checkpoint_every`` epochs and at the end
    (not of a diverged model), the clock paused."""
    every = s.cfg.train.checkpoint_every
    if every <= 0 or s.status == "diverged" or not (last or s.epoch % every == 0):
        return
    checkpoints(s).save(barrier=runtime.barrier)
