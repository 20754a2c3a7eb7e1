"""Rank 0's per-epoch table while a run trains, and at its end the curve CSV, the
time-to-accuracy figure and the record (:func:`write`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
import torch.distributed as dist

from bench.cluster.emulated import LinkClock, link_bytes
from bench.comm import is_sparse
from bench.config import to_container
from bench.results import columns as col
from bench.results import records
from bench.results.outputs import closing_lines
from bench.results.plots import plot_time_to_accuracy
from bench.train import checkpoint as ck
from bench.train.progress import machine_load
from bench.train.state import TrainState


def header(s: TrainState) -> None:
    cfg = s.cfg
    print(
        f"run {s.run['run_id']}: {cfg.model.name} on {cfg.data.name}, {s.world} workers "
        f"({s.nnodes} node(s)), comm={cfg.comm.name}, sync={cfg.sync.name}, "
        f"update={cfg.optim.update}, target {cfg.train.target_metric} >= {cfg.train.target_value}",
        flush=True,
    )
    print(" ".join(f"{name:>{w}}" for name, _, w, _, _ in table(s)), flush=True)


def epoch_line(s: TrainState, row: dict[str, Any]) -> None:
    """The epoch's line of the table; the curve so far to the CSV."""
    print(" ".join(format(row[k] * sc, f">{w}{f}") for _, k, w, f, sc in table(s)), flush=True)
    records.write_curve(s.cfg.results.dir, s.run["run_id"], s.curve, extend=True)


def table(s: TrainState) -> list[tuple[str, str, int, str, float]]:
    """(header, curve column, width, format, scale); top-5 above 10 classes or as target."""
    top5 = s.cfg.train.target_metric == "top5" or s.workload.data.num_classes > 10
    metrics = [m for m in s.workload.metrics if m != "loss" and (m != "top5" or top5)]
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


def link_readings(s: TrainState) -> list[Any]:
    """Every worker's link counters (each emulated node's first worker reads its own)."""
    mine = s.clock.reading() if isinstance(s.clock, LinkClock) else None
    if not dist.is_initialized():
        return [mine]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def write(s: TrainState, links: list[Any] | None = None) -> records.RunRecord:
    """The curve CSV, the figure and the record (``links``: every worker's counters)."""
    cfg, res = s.cfg, s.cfg.results.dir
    rec = records.RunRecord.start(
        cfg, s.run, config=to_container(cfg), comm_sparse=is_sparse(cfg.comm.name), nnodes=s.nnodes
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
    rec.translations = s.workload.write_translations(res, rec.run_id)  # translation: decoded
    if cfg.results.plot and s.curve and (cfg.results.plot_sweeps or not cfg.results.sweep_id):
        rec.figure = str(
            plot_time_to_accuracy(
                [(f"{rec.model} {rec.comm} x{rec.world_size}", pd.DataFrame(s.curve))],
                metric=rec.target_metric,
                target=rec.target_value,
                path=records.figure_path(res, rec.run_id),
                hardware=rec.hardware,
                title=f"{rec.experiment}: time to {100 * rec.target_value:g} % "
                f"{rec.target_metric} ({rec.run_id})",
            )
        )
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
