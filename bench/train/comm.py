"""The comm hook in a training run: checked before launch (:func:`validate`), attached after
DDP wrapping (:func:`attach`), driven by :class:`CommController` (warm-up, density schedule,
per-step statistics and phases)."""

from __future__ import annotations

import functools
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import torch

from bench.comm import HOOKS, HookOptions, cost, is_sparse, make_hook
from bench.comm import placement as placements
from bench.comm.config import CommConfig, config_keys
from bench.comm.hooks import NOCOMM, NoCommState
from bench.comm.state import Stateful, stateful
from bench.comm.stats import ring
from bench.comm.topology import check_topology
from bench.optim import OPTIMIZERS
from bench.registry import ConfigError

LOCAL = NOCOMM  # the hook of an optimizer that exchanges its own state: local gradients


def validate(
    cfg: CommConfig, world_size: int, nnodes: int, optim: Any = None, amp: str = "off"
) -> None:
    """Refuse a bad ``comm`` config before any worker starts, or one the ``optim`` config
    cannot train with (beside DeMo's own exchange, a placement that does not fit)."""
    spec = HOOKS.get(cfg.name)
    name = getattr(optim, "name", None)
    if name is not None and OPTIMIZERS.get(name).local_gradients and cfg.name != LOCAL:
        raise ConfigError(
            f"optim={name} exchanges its own compressed momentum and trains on each "
            f"worker's local gradient: use comm={LOCAL}, not comm={cfg.name}"
        )
    opts = HookOptions.of(cfg)
    for key in ("warmup_epochs", "warmup_steps", "schedule_steps"):
        if int(getattr(cfg, key)) < 0:
            raise ConfigError(f"comm.{key} must be >= 0, got {getattr(cfg, key)}")
    if optim is not None or opts.placement != "grad":
        placements.check(
            opts.placement,
            sparse=spec.sparse,
            comm=cfg.name,
            optim=optim if optim is not None else NO_OPTIM,
            amp=amp,
            error_feedback=opts.error_feedback,
            warmup=int(cfg.warmup_steps) + int(cfg.warmup_epochs),
        )
    for d in cfg.density_schedule:
        if not 0.0 < float(d) <= 1.0:
            raise ConfigError(f"comm.density_schedule values must be in (0, 1], got {d}")
    if float(cfg.bucket_cap_mb) <= 0:
        raise ConfigError(f"comm.bucket_cap_mb must be > 0, got {cfg.bucket_cap_mb}")
    if nnodes < 1 or world_size % nnodes:
        raise ConfigError(f"{nnodes} nodes do not divide the world size {world_size}")
    ppn = opts.procs_per_node or world_size // nnodes
    check_topology(world_size, ppn)
    if spec.validate is not None:
        try:
            spec.validate(opts, world_size, world_size // ppn)
        except ConfigError as e:  # worded in make_hook's keywords: here, the config's keys
            raise config_keys(e) from None


# the ``optim`` config when the caller has none: it fits no placement but ``grad``
NO_OPTIM = SimpleNamespace(
    name="none", momentum=0.0, weight_decay=0.0, clip_norm=0.0, update="naive"
)


class CommController:
    def __init__(self, state: Any, cfg: CommConfig, steps_per_epoch: int) -> None:
        self.state = state
        self.name = str(cfg.name)
        self.sparse = is_sparse(self.name)
        self.density = float(cfg.density)
        self.warmup_epochs = int(cfg.warmup_epochs)
        self.warmup_steps = int(cfg.warmup_steps)
        self.schedule = [float(d) for d in cfg.density_schedule]
        self.schedule_steps = int(cfg.schedule_steps)
        self.steps_per_epoch = steps_per_epoch
        self.epoch = 0
        self.in_step = False  # a bucket of the running step has been handed to the hook
        self.exchange: Any = None  # an optimizer exchanging its own state (count_optimizer)

    def dense_steps(self) -> int:
        """Optimizer steps sent dense before compression: the later of both warm-ups."""
        return max(self.warmup_epochs * int(self.steps_per_epoch or 0), self.warmup_steps)

    def density_for(self, epoch: int, step: int | None = None) -> float:
        """Density of ``epoch`` (0-based), or of ``step`` (from the run's start): 1.0 in warm-up,
        then the schedule, its last value repeating."""
        if epoch < self.warmup_epochs or (step is not None and step < self.warmup_steps):
            return 1.0
        if self.schedule:
            if self.schedule_steps and step is not None:
                i = (step - self.dense_steps()) // self.schedule_steps
            elif self.schedule_steps:  # per epoch, asked without a step: its first step
                return self.density_for(epoch, epoch * int(self.steps_per_epoch or 0))
            else:
                i = epoch - self.warmup_epochs
            return self.schedule[max(0, min(i, len(self.schedule) - 1))]
        return self.density

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.state.force_dense = epoch < self.warmup_epochs
        if self.sparse:  # the others send whole buckets: no density to set
            self.state.density = self.density_for(epoch)

    def begin_step(self) -> None:
        """Before the step's first bucket: its density, and its phase in the statistics."""
        if self.sparse:
            step = int(self.state.step)
            self.state.density = self.density_for(self.epoch, step)
            # the warm-up sends dense; a configured density of 1.0 stays the sparse path
            self.state.force_dense = self.epoch < self.warmup_epochs or step < self.warmup_steps
        self.state.stats.begin_step(*self.state.phase(self.name))

    def pop_stats(self) -> dict[str, float]:
        """Per-step means since the last pop, after the hook's finiteness flags (a device read)."""
        self.state.check_finite()
        self.in_step = False
        return self.state.stats.pop()

    def states(self) -> dict[str, Stateful]:
        """This rank's share of a checkpoint: its hook's state and DeMo's optimizer's."""
        return {"hook": self.state, **({"exchange": self.exchange} if self.exchange else {})}

    def wrap(self, hook: Any) -> Any:
        """``hook`` with :meth:`begin_step` before each step's first bucket."""

        @functools.wraps(hook)  # DDP checks the hook's signature: the hook's own
        def hooked(state, bucket):  # noqa: ANN001, ANN202 (annotations: the hook's)
            if not self.in_step:
                self.in_step = True
                self.begin_step()
            if bucket.is_last():
                self.in_step = False
            return hook(state, bucket)

        return hooked


def attach(
    ddp_model: torch.nn.Module,
    cfg: CommConfig,
    steps_per_epoch: int,
    optimizer: Any = None,
    process_group: Any = None,
    optim: Any = None,
) -> CommController:
    """Register ``cfg.name``'s hook on a DDP model, every rank, before a checkpoint is loaded;
    ``optimizer``: counted when it exchanges its own state (DeMo), bound by a placement other
    than ``grad``; ``process_group``: DDP's, when not the world's."""
    import torch.distributed as dist

    own = optim is not None and OPTIMIZERS.get(optim.name).local_gradients
    if not dist.is_initialized():
        controller = CommController(NoCommState(), cfg, steps_per_epoch)  # one process
        if own:
            count_optimizer(controller, optimizer, own_steps=True)
        return controller
    # a hook with its own warm-up counter (PowerSGD's start_powerSGD_iter) counts steps;
    # the others are told each step's density and warm-up by the controller
    spec = HOOKS.get(cfg.name)
    controller = CommController(None, cfg, steps_per_epoch)
    opts = HookOptions.of(cfg, warmup_steps=controller.dense_steps() if spec.own_warmup else 0)
    state, hook = make_hook(cfg.name, model=ddp_model, process_group=process_group, **asdict(opts))
    if str(cfg.placement) != "grad":
        if optimizer is None:
            raise ConfigError(f"comm.placement={cfg.placement} needs the optimizer (attach)")
        state.placement.bind(optimizer)
    controller.state = state
    ddp_model.register_comm_hook(state, controller.wrap(hook))
    if own:
        count_optimizer(controller, optimizer, own_steps=False)
    return controller


def count_optimizer(controller: CommController, optimizer: Any, own_steps: bool) -> None:
    """Count an optimizer's own exchange (DeMo's all-gather, told by its ``on_send``) in the
    statistics and keep its state in this rank's checkpoint."""
    import torch.distributed as dist

    controller.exchange = stateful(optimizer, "an optimizer exchanging its own state:")
    world = dist.get_world_size() if dist.is_initialized() else 1
    stats = controller.state.stats
    nodes, per_node = ring(world, bool(controller.state.multinode))

    def on_send(packet: int, pairs: int, numel: int) -> None:
        traffic = cost.demo(packet, nodes, per_node) if world > 1 else None
        stats.count(traffic or cost.Traffic(()), pairs, numel if own_steps else 0)
        if own_steps:
            stats.steps += 1

    optimizer.on_send = on_send
    optimizer.times = stats.times  # its transform and decode as selection, its all-gather
