"""The data-parallel training loop (one process per worker).

Started by a launcher (:mod:`bench.cluster.launch`) through torch.distributed's elastic
agent, which sets RANK/WORLD_SIZE/LOCAL_RANK/GROUP_RANK/LOCAL_WORLD_SIZE; entry points
``python -m bench.train --config run.json`` and :func:`main`.

Per step, the phases are timed: ``data`` (waiting for the next batch), ``compute``
(forward and backward, including DDP's gradient communication, which overlaps the
backward pass), ``update`` (optimizer step); the communication library adds its own
selection and communication times.  Training time follows :mod:`bench.results.timing`.
Rank 0 writes the run record, the per-epoch curve and the time-to-accuracy plot.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from bench.config import from_container
from bench.results import records
from bench.results.env import git_sha, hardware, versions
from bench.results.timing import TrainClock, best_value, reached, time_to_target


def setup_distributed(cfg: Any) -> tuple[int, int, torch.device]:
    """Initialise the default process group from the launcher's environment."""
    use_cuda = torch.cuda.is_available() and cfg.train.device in ("auto", "cuda")
    if cfg.train.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device=cuda but CUDA is not available")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    backend = cfg.cluster.backend
    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    # share the cores of a node between its workers (intra-op threads)
    threads = cfg.cluster.threads_per_worker or max(1, (os.cpu_count() or 1) // local_world)
    torch.set_num_threads(threads)
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    return rank, world, device


def amp_context(cfg: Any, device: torch.device) -> tuple[Any, torch.amp.GradScaler | None]:
    mode = cfg.train.amp
    if mode == "auto":
        mode = "bf16" if device.type == "cuda" else "off"
    if mode == "off":
        return contextlib.nullcontext, None
    dtype = torch.bfloat16 if mode == "bf16" else torch.float16
    scaler = torch.amp.GradScaler(device.type) if mode == "fp16" else None
    return (lambda: torch.autocast(device.type, dtype=dtype)), scaler


class PhaseTimer:
    """Accumulates seconds per phase; on CUDA optionally synchronises at boundaries."""

    def __init__(self, device: torch.device, sync: bool) -> None:
        self.sync = sync and device.type == "cuda"
        self.totals: dict[str, float] = {}
        self._t = time.perf_counter()

    def mark(self, phase: str) -> None:
        if self.sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.totals[phase] = self.totals.get(phase, 0.0) + now - self._t
        self._t = now

    def restart(self) -> None:
        self._t = time.perf_counter()

    def pop(self) -> dict[str, float]:
        out, self.totals = self.totals, {}
        return out


def broadcast_buffers(model: torch.nn.Module) -> None:
    """Evaluate every rank with rank 0's BN statistics (each rank updated its own)."""
    if dist.is_initialized():
        for b in model.buffers():
            dist.broadcast(b, 0)


def _fmt_row(r: dict[str, Any]) -> str:
    return (
        f"{r['epoch']:>5d} {r['lr']:>8.4f} {r['train_loss']:>10.4f} {100 * r['train_top1']:>9.2f} "
        f"{100 * r['top1']:>8.2f} {100 * r['top5']:>8.2f} {r['train_time_s']:>10.2f} "
        f"{r['epoch_train_s']:>8.2f} {r['throughput_samples_per_s']:>9.1f} {100 * r['data_pct']:>6.1f}"
    )


TABLE_HEADER = (
    f"{'epoch':>5} {'lr':>8} {'train_loss':>10} {'train_top1':>9} {'top1%':>8} {'top5%':>8} "
    f"{'train_s':>10} {'epoch_s':>8} {'samples/s':>9} {'data%':>6}"
)


def train(payload: dict[str, Any]) -> dict[str, Any] | None:
    """Run one training job in this worker; rank 0 returns (and writes) the record."""
    from tqdm import tqdm

    from bench.comm import attach
    from bench.optim import build_optimizer, build_scheduler
    from bench.workload import WORKLOADS

    cfg = from_container(payload["config"])
    run = dict(payload["run"])
    rank, world, device = setup_distributed(cfg)
    if dist.is_initialized():  # every node agrees on rank 0's run id and launch time
        obj = [run]
        dist.broadcast_object_list(obj, 0)
        run = obj[0]
    torch.manual_seed(cfg.train.seed)
    nnodes = int(os.environ.get("GROUP_WORLD_SIZE", world // int(os.environ.get("LOCAL_WORLD_SIZE", world))))

    workload = WORKLOADS.get(cfg.train.workload)(cfg, rank, world, device)
    model = workload.model.to(device)
    if device.type == "cuda" and cfg.model.channels_last:
        model = model.to(memory_format=torch.channels_last)
    data = workload.data
    steps = len(data.train)
    if cfg.train.max_steps_per_epoch > 0:
        steps = min(steps, cfg.train.max_steps_per_epoch)
    if steps < 1:
        raise RuntimeError(f"an epoch has no training step on rank {rank}: the data set is smaller than one batch")
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = build_scheduler(optimizer, cfg.optim, steps, cfg.train.epochs)
    ddp_extra: dict[str, Any] = {}
    with contextlib.suppress(ImportError):
        from bench.optim import ddp_kwargs  # update modes that own the gradient buffer

        ddp_extra = ddp_kwargs(optimizer)
    ddp = DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=cfg.comm.bucket_cap_mb,
        **ddp_extra,
    ) if dist.is_initialized() else model
    comm = attach(ddp, cfg.comm, steps_per_epoch=steps)
    autocast, scaler = amp_context(cfg, device)
    timer = PhaseTimer(device, cfg.train.time_phases)
    clock = TrainClock()
    curve: list[dict[str, Any]] = []
    status = "target_missed"
    samples_seen = 0
    metric, target = cfg.train.target_metric, cfg.train.target_value

    if rank == 0:
        print(f"run {run['run_id']}: {cfg.model.name} on {cfg.data.name}, {world} workers "
              f"({nnodes} node(s)), comm={cfg.comm.name}, update={cfg.optim.update}, "
              f"target {metric} >= {target}", flush=True)
        print(TABLE_HEADER, flush=True)
    if dist.is_initialized():
        dist.barrier()
    for epoch in range(cfg.train.epochs):
        data.train.set_epoch(epoch)
        comm.set_epoch(epoch)
        ddp.train()
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        correct = torch.zeros((), dtype=torch.float64, device=device)
        n_local = 0
        bar = tqdm(total=steps, desc=f"epoch {epoch + 1}", leave=False, dynamic_ncols=True,
                   disable=not (rank == 0 and cfg.train.progress), file=sys.stderr)
        clock.start()
        t_epoch = time.perf_counter()
        timer.restart()
        it = iter(data.train)
        for _ in range(steps):
            batch = next(it)
            timer.mark("data")
            with autocast():
                loss, ok = workload.loss(ddp, batch)
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            timer.mark("compute")
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            scheduler.step()
            timer.mark("update")
            loss_sum += loss.detach().double()
            correct += ok.double()
            n_local += batch[1].shape[0]
            bar.update(1)
        del it
        epoch_train_s = time.perf_counter() - t_epoch
        clock.pause()
        bar.close()
        samples = n_local * world
        samples_seen += samples
        phases = timer.pop()
        stats = {"lr": scheduler.get_last_lr()[0], **data.train.epoch_stats(), **comm.pop_stats()}
        # training loss/accuracy across workers
        tr = torch.stack([loss_sum, correct]).to(torch.float64)
        if dist.is_initialized():
            dist.all_reduce(tr)
        train_loss = tr[0].item() / (steps * world)
        diverged = not math.isfinite(train_loss)

        t_eval = time.perf_counter()
        last = epoch + 1 == cfg.train.epochs
        ev: dict[str, float] = {}
        if not diverged and ((epoch + 1) % cfg.train.eval_every == 0 or last):
            broadcast_buffers(model)
            ev = workload.evaluate(model, data.eval, autocast)
        eval_s = time.perf_counter() - t_eval
        row = {
            "epoch": epoch + 1,
            "train_time_s": clock.elapsed,
            "epoch_train_s": epoch_train_s,
            "eval_time_s": eval_s,
            "train_loss": train_loss,
            "train_top1": tr[1].item() / max(1, samples),
            "top1": ev.get("top1", float("nan")),
            "top5": ev.get("top5", float("nan")),
            "eval_loss": ev.get("loss", float("nan")),
            "samples": samples,
            "steps": steps,
            "throughput_samples_per_s": samples / epoch_train_s,
            "data_pct": phases.get("data", 0.0) / epoch_train_s,
            **{f"time/{k}_s": v / steps for k, v in phases.items()},
            **stats,
        }
        curve.append(row)
        if rank == 0:
            print(_fmt_row(row), flush=True)
        if diverged:
            status = "diverged"
            break
        if reached(ev.get(metric), target):
            status = "ok"
            if cfg.train.stop_at_target:
                break

    for loader in (data.train, data.eval):  # stop loader workers / DALI pipelines now, not at exit
        if hasattr(loader, "close"):
            loader.close()
    record = None
    if rank == 0:
        record = _write_outputs(cfg, payload["config"], run, curve, status, world, nnodes, samples_seen, clock)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return record


def _mean(curve: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in curve if r.get(key) is not None and not (isinstance(r[key], float) and math.isnan(r[key]))]
    return sum(vals) / len(vals) if vals else None


def _write_outputs(cfg: Any, cfg_dict: dict[str, Any], run: dict[str, Any], curve: list[dict[str, Any]],
                   status: str, world: int, nnodes: int, samples_seen: int, clock: TrainClock) -> dict[str, Any]:
    metric, target = cfg.train.target_metric, cfg.train.target_value
    tt, et = time_to_target(curve, metric, target)
    train_s = clock.elapsed
    hw = hardware()
    step_s = sum(_mean(curve, k) or 0.0 for k in ("time/data_s", "time/compute_s", "time/update_s"))
    record: dict[str, Any] = {
        "run_id": run["run_id"],
        "started_at": run["started_at"],
        "status": status,
        "experiment": run.get("experiment", cfg.experiment),
        "model": cfg.model.name,
        "data": cfg.data.name,
        "comm": cfg.comm.name,
        "comm_density": cfg.comm.density if cfg.comm.name not in ("dense", "fp16", "bf16", "powersgd") else 1.0,
        "comm_warmup_epochs": cfg.comm.warmup_epochs,
        "comm_density_schedule": list(cfg.comm.density_schedule),
        "update": cfg.optim.update,
        "optimizer": cfg.optim.name,
        "cache": cfg.cache.name,
        "loader": cfg.data.loader,
        "world_size": world,
        "nnodes": nnodes,
        "target_metric": metric,
        "target_value": target,
        "best_value": best_value(curve, metric),
        "time_to_target_s": tt,
        "epochs_to_target": et,
        "epochs_run": len(curve),
        "train_time_s": train_s,
        "wall_time_s": time.time() - run["launch_time"],
        "throughput_samples_per_s": samples_seen / train_s if train_s > 0 else None,
        "step_time_s": step_s,
        "data_share": (_mean(curve, "time/data_s") or 0.0) / step_s if step_s else None,
        "update_share": (_mean(curve, "time/update_s") or 0.0) / step_s if step_s else None,
        "comm_bytes_per_step": _mean(curve, "comm/bytes_per_step"),
        "comm_inter_node_bytes_per_step": _mean(curve, "comm/inter_node_bytes_per_step"),
        "select_s_per_step": _mean(curve, "time/select_s"),
        "comm_s_per_step": _mean(curve, "time/comm_s"),
        "curve": str(records.curve_path(cfg.results.dir, run["run_id"])),
        "git_sha": git_sha(),
        "torch_version": torch.__version__,
        "versions": versions(),
        "hardware": hw,
        "config": cfg_dict,
    }
    link = os.environ.get("BENCH_LINK_CHECK")
    if link and Path(link).is_file():
        record["link_check"] = json.loads(Path(link).read_text())
    records.write_curve(cfg.results.dir, run["run_id"], curve)
    if cfg.results.plot and curve:
        import pandas as pd

        from bench.results.plots import plot_time_to_accuracy

        fig = Path(cfg.results.dir) / "figures" / f"{run['run_id']}_tta.png"
        plot_time_to_accuracy(
            [(f"{cfg.model.name} {cfg.comm.name} x{world}", pd.DataFrame(curve))], metric=metric,
            target=target, path=fig, hardware=hw,
            title=f"{record['experiment']}: time to {100 * target:g} % {metric} ({run['run_id']})",
        )
        record["figure"] = str(fig)
    records.append_record(cfg.results.dir, record)
    tts = f"{tt:.1f} s (epoch {et})" if tt is not None else "not reached"
    print(f"status {status}; time to {100 * target:g} % {metric}: {tts}; training time {train_s:.1f} s; "
          f"record appended to {records.runs_path(cfg.results.dir)}", flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one data-parallel training worker")
    ap.add_argument("--config", required=True, help="run JSON written by the launcher")
    args = ap.parse_args(argv)
    payload = json.loads(Path(args.config).read_text())
    train(payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
