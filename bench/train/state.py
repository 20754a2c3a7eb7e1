"""One worker's run as one object; its progress a ``Stateful`` for the checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from bench.config import Config
from bench.results.mllog import RunLog
from bench.results.timing import TrainClock
from bench.train.runtime import PhaseTimer
from bench.train.sync import OuterSync


@dataclass
class TrainState:
    """A checkpoint saves the changing part (tensors, scheduler, scaler, the hook's residuals,
    the progress below); loaders derive their order from (seed, ``epoch``)."""

    cfg: Config
    run: dict[str, Any]  # run id, start time, launch time, experiment (rank 0's)
    rank: int
    world: int
    nnodes: int
    device: torch.device
    workload: Any  # bench.train.workload: data, model, loss, evaluate
    model: nn.Module  # the bare model (evaluation, checkpoints)
    ddp: nn.Module  # what trains: the DDP wrapper, or the model in a single process
    optimizer: torch.optim.Optimizer
    scheduler: Any  # torch LR scheduler, stepped once per optimizer step
    comm: Any  # the comm controller: warm-up, density schedule, statistics, the hook
    autocast: Callable[[], Any]
    scaler: torch.amp.GradScaler | None
    steps: int  # optimizer steps per epoch
    timer: PhaseTimer
    clock: TrainClock = field(default_factory=TrainClock)
    curve: list[dict[str, Any]] = field(default_factory=list)
    epoch: int = 0  # epochs completed (the next epoch's 0-based index)
    step: int = 0  # optimizer steps completed
    status: str = "target_missed"
    diverged_at: dict[str, Any] | None = None  # step, epoch and place of the first NaN/Inf
    # sub-epoch evaluations (under an outer sync every one): step, epoch, time, metrics
    evals: list[dict[str, Any]] = field(default_factory=list)
    # train.eval_stride: (point, model state) of each step skipped since the last
    # evaluation (not checkpointed: a resumed run's first stride keeps its evaluated ones)
    kept: list[tuple[dict[str, Any], dict[str, torch.Tensor]]] = field(default_factory=list)
    # an evaluation point waits for the global model (under an outer sync: the next one)
    pending: bool = False
    at_sync: bool = True  # the model is the global one: the last step ended an outer sync
    mllog: RunLog = field(default_factory=lambda: RunLog(None))  # rank 0's MLPerf log
    sync: OuterSync = field(default_factory=OuterSync)  # the nodes' outer sync (none: ddp)

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "step": self.step,
            "train_time_s": self.clock.elapsed,
            "status": self.status,
            "curve": self.curve,
            "evals": self.evals,
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.clock.load_state_dict({"elapsed": d["train_time_s"]})
        self.curve = [dict(r) for r in d["curve"]]
        self.evals = [dict(e) for e in d.get("evals", [])]  # older checkpoints have none
        self.epoch, self.step, self.status = d["epoch"], d["step"], d["status"]
