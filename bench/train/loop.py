"""The data-parallel training loop of one worker: :func:`train` builds a
:class:`~bench.train.state.TrainState`, trains, evaluates and checkpoints it epoch by epoch,
and rank 0 writes the run's record and outputs."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.cluster.emulated import LinkClock
from bench.config import from_container
from bench.data.loaders import RANK_TOKENS
from bench.optim import after_ddp_broadcast, build_optimizer, build_scheduler, ddp_kwargs
from bench.results import columns as col
from bench.results.divergence import exploded
from bench.results.mllog import RunLog
from bench.results.timing import reached
from bench.train import checkpoint as ck
from bench.train import evaluation, outputs, runtime
from bench.train.comm import attach
from bench.train.progress import epoch_bar, show_step, watch_load
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
    batches, max_steps = len(workload.data.train), cfg.train.max_steps_per_epoch
    steps = min(batches, max_steps) if max_steps > 0 else batches
    if steps < 1:
        raise RuntimeError(
            f"an epoch has no training step on rank {rank}: the data set is smaller than one batch"
        )
    optimizer = build_optimizer(model, cfg.optim)
    outer = OuterSync(cfg, rank, world)  # sync=ddp: group None, the world is DDP's
    ddp = model
    if dist.is_initialized():
        ddp = DDP(
            model,
            process_group=outer.group,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=cfg.comm.bucket_cap_mb,
            # no BatchNorm buffers at every forward (link bytes no method counted): training
            # uses the batch's statistics, evaluation and checkpoints take rank 0's
            **runtime.NO_BUFFER_SYNC,
            **ddp_kwargs(optimizer),  # update modes that own the gradient buffer
        )
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
        comm=attach(ddp, cfg.comm, steps, optimizer, outer.group, optim=cfg.optim),
        autocast=autocast,
        scaler=scaler,
        steps=steps,
        timer=runtime.PhaseTimer(device, cfg.train.time_phases),
        clock=LinkClock.of_worker(),  # an emulated node's link bytes while it trains
    )
    s.comm.state.nan_check = cfg.train.nan_check == "step"
    s.sync = outer.start(model, optimizer, s.comm.state.stats, device)
    checkpoints(s).resume()  # after an elastic restart or by hand: from its last checkpoint
    s.sync.synced()  # from here on: which steps end with an outer synchronisation
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
        local={**s.comm.states(), "replica": s.sync.state},  # rank<r>.pt's: its own
        progress=s,
    )


def train_step(s: TrainState, batch: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Forward, backward (DDP communicates), update: (loss, correct predictions), or None
    when a NaN/Inf was found (the update skipped, ``s.status`` diverged)."""
    with s.autocast():
        loss, correct = s.workload.loss(s.ddp, batch)
    if s.rank == 0 and os.environ.get("BENCH_FAULT_NAN_STEP") == str(s.step + 1):
        loss = loss * float("nan")  # fault injection for tests: rank 0's loss NaN at step N
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


def _diverged(s: TrainState, loss: torch.Tensor) -> bool:
    """Whether this step's reduced gradient holds a NaN or Inf (the hook's device flags, read
    once here, else the gradients); where, in ``s.diverged_at``."""
    found = s.comm.state.take_finite()
    if found is not None:
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
        dt, hit = evaluation.after_step(s, last=i == s.steps - 1)
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
    tokens = stats.get(RANK_TOKENS)
    extra = [] if tokens is None else [float(tokens)]
    skipped = float(stats.get("data/corrupt", 0))  # this rank's damaged images (loaders)
    counts = torch.cat([sums, sums.new_tensor([samples, skipped, *extra])])
    loss_sum, correct, samples, skipped, *total_tokens = runtime.all_reduce_sum(counts).tolist()
    phases = s.timer.pop()
    return {
        **stats,
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
        outputs.epoch_line(s, row)
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


def finish(s: TrainState, leave_group: bool = True) -> dict[str, Any] | None:
    """Stop the loaders, write the outputs (rank 0), leave the group (a queue keeps it)."""
    s.workload.data.close()  # loader workers and DALI pipelines stop now, not at exit
    s.sync.close()  # the outer sync's Manager, then the Lighthouse (every rank takes part)
    links = outputs.link_readings(s)
    record = outputs.write(s, links).to_dict() if s.rank == 0 else None
    if dist.is_initialized():
        dist.barrier()
        if leave_group:
            dist.destroy_process_group()
    return record


def train(payload: dict[str, Any], leave_group: bool = True) -> dict[str, Any] | None:
    """Run one training job in this worker; rank 0 returns (and writes) the record."""
    init_start = time.time()
    watch_load(payload)  # a busy machine is named before the run sets up
    s = setup(payload)
    cfg = s.cfg
    s.mllog = RunLog.open(cfg.results.dir, s.run["run_id"], s.rank)
    if s.rank == 0:
        outputs.header(s)
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
        evaluated = evaluation.after_epoch(s, row)
        go_on = end_epoch(s, row, evaluated, time.perf_counter() - t_eval)
        # every ``checkpoint_every`` epochs and at the end, not of a diverged model
        every = cfg.train.checkpoint_every
        if every > 0 and s.status != "diverged" and (not go_on or s.epoch % every == 0):
            checkpoints(s).save(barrier=runtime.barrier)
        if go_on and os.environ.get("BENCH_FAULT_EPOCH_HOLD_S"):  # fault injection for tests:
            time.sleep(float(os.environ["BENCH_FAULT_EPOCH_HOLD_S"]))  # a fault lands in time
    return finish(s, leave_group)
