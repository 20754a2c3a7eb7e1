"""The comm hook in a training run: checked before launch, attached after DDP wrapping,
driven per epoch (dense warm-up epochs, density schedule, per-step statistics).

    validate(cfg.comm, world_size, nnodes, optim=cfg.optim, amp=cfg.train.amp)  # launcher
    controller = attach(ddp_model, cfg.comm, steps_per_epoch=n, optimizer=opt)  # after DDP
    controller.set_epoch(epoch)     # before each epoch
    stats = controller.pop_stats()  # after each epoch: per-step means since the last pop
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import torch

from bench.comm import HOOKS, CommStats, HookOptions, is_sparse, make_hook
from bench.comm import placement as placements
from bench.comm.config import CommConfig
from bench.comm.topology import check_topology
from bench.registry import ConfigError


def validate(
    cfg: CommConfig, world_size: int, nnodes: int, optim: Any = None, amp: str = "off"
) -> None:
    """Refuse a bad ``comm`` config before any worker starts (raises ConfigError); with
    ``optim`` (the ``optim`` config) also a placement that does not fit it."""
    spec = HOOKS.get(cfg.name)
    opts = HookOptions.of(cfg)
    if int(cfg.warmup_steps) < 0:
        raise ConfigError(f"comm.warmup_steps must be >= 0, got {cfg.warmup_steps}")
    if optim is not None or opts.placement != "grad":
        placements.check(
            opts.placement,
            sparse=spec.sparse,
            comm=cfg.name,
            optim=optim if optim is not None else _NO_OPTIM,
            amp=amp,
            error_feedback=opts.error_feedback,
            warmup=int(cfg.warmup_steps) + int(cfg.warmup_epochs),
        )
    for d in cfg.density_schedule:
        if not 0.0 < float(d) <= 1.0:
            raise ConfigError(f"comm.density_schedule values must be in (0, 1], got {d}")
    if int(cfg.warmup_epochs) < 0:
        raise ConfigError(f"comm.warmup_epochs must be >= 0, got {cfg.warmup_epochs}")
    if float(cfg.bucket_cap_mb) <= 0:
        raise ConfigError(f"comm.bucket_cap_mb must be > 0, got {cfg.bucket_cap_mb}")
    if nnodes < 1 or world_size % nnodes:
        raise ConfigError(f"{nnodes} nodes do not divide the world size {world_size}")
    ppn = opts.procs_per_node or world_size // nnodes
    check_topology(world_size, ppn)
    if spec.validate is not None:
        spec.validate(opts, world_size, world_size // ppn)


class _NoOptim:
    """The ``optim`` config when the caller has none: fits no placement but ``grad``."""

    name, momentum, weight_decay, clip_norm, update = "none", 0.0, 0.0, 0.0, "naive"


_NO_OPTIM = _NoOptim()


class _LocalState:
    """Hook state stand-in for a single, non-distributed process: nothing is sent."""

    def __init__(self) -> None:
        self.force_dense = False
        self.density = 1.0
        self.stats = CommStats()

    def pop_stats(self) -> dict[str, float]:
        return self.stats.pop()


class CommController:
    """Applies the warm-up and density schedule per epoch and collects per-step stats."""

    def __init__(self, state: Any, cfg: CommConfig, steps_per_epoch: int) -> None:
        self.state = state
        self.name = str(cfg.name)
        self.sparse = is_sparse(self.name)
        self.density = float(cfg.density)
        self.warmup_epochs = int(cfg.warmup_epochs)
        self.schedule = [float(d) for d in cfg.density_schedule]
        self.steps_per_epoch = steps_per_epoch

    def density_for(self, epoch: int) -> float:
        """Density of an epoch: 1.0 in warm-up, then the schedule (last value repeats)."""
        if epoch < self.warmup_epochs:
            return 1.0
        if self.schedule:
            return self.schedule[min(epoch - self.warmup_epochs, len(self.schedule) - 1)]
        return self.density

    def set_epoch(self, epoch: int) -> None:
        self.state.force_dense = epoch < self.warmup_epochs
        if self.sparse:  # the others send whole buckets: no density to set
            self.state.density = self.density_for(epoch)

    def pop_stats(self) -> dict[str, float]:
        """Per-step means since the last pop; first reads the hook's unread finiteness flags
        (one sync, raising ValueError on NaN/Inf: the hooks never read the device)."""
        check = getattr(self.state, "check_finite", None)
        if check is not None:
            check()
        return self.state.stats.pop()


def attach(
    ddp_model: torch.nn.Module,
    cfg: CommConfig,
    steps_per_epoch: int,
    optimizer: torch.optim.Optimizer | None = None,
) -> CommController:
    """Register the hook of ``cfg.name`` on a DDP model; call on every rank after DDP
    wrapping (and before a checkpoint is loaded).  A placement other than ``grad`` gets
    ``optimizer``: ``grad+dgc`` takes its momentum and weight decay over, ``update`` marks
    its variance frozen (bench/comm/placement.py).  One process: no hook, the optimizer
    as configured."""
    import torch.distributed as dist

    if not dist.is_initialized() or not hasattr(ddp_model, "register_comm_hook"):
        return CommController(_LocalState(), cfg, steps_per_epoch)  # one process: no exchange
    # a hook with its own warm-up counter (PowerSGD's start_powerSGD_iter) counts the
    # warm-up epochs as steps; the others are told them per epoch (set_epoch)
    own = HOOKS.get(cfg.name).own_warmup
    epochs = int(cfg.warmup_epochs) * int(steps_per_epoch) if own else 0
    warmup_steps = int(cfg.warmup_steps) + epochs
    opts = asdict(HookOptions.of(cfg, warmup_steps=warmup_steps))
    state, hook = make_hook(cfg.name, model=ddp_model, **opts)
    place = getattr(state, "placement", None) if str(cfg.placement) != "grad" else None
    if place is not None:
        if optimizer is None:
            raise ConfigError(f"comm.placement={cfg.placement} needs the optimizer (attach)")
        place.bind(optimizer)
    ddp_model.register_comm_hook(state, hook)
    return CommController(state, cfg, steps_per_epoch)
