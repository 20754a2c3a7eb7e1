"""Gradient communication for DDP: top-k selection, error feedback, communicators, hooks.

Three separate pieces with registries (GRACE-style), combined into DDP communication hooks:

- ``selection.py``: ``topk``, ``mstopk`` (MSTopK and its faster variants), ``randomk``;
- ``compressors.py``: compressors (dense, fp16, bf16, topk, mstopk, randomk) and the
  error-feedback memory;
- ``communicators.py``: dense allreduce, flat sparse allgather, HiTopKComm, all
  asynchronous (``futures.py``: timed collectives, stages chained in bucket order);
- ``wire.py``: packet format, low-precision wire values that never overflow;
- ``stats.py`` and ``timing.py``: bytes sent and the definitions of ``time/select_s`` and
  ``time/comm_s``, the same for every method;
- ``topology.py``: intra-node and inter-node process groups;
- ``hooks.py``: :func:`make_hook` for any DDP user; every hook returns its future without
  waiting for a collective;
- ``state.py``, ``state_io.py``, ``layout.py``: the hook's public state
  (:class:`CommHookState`): made before the process group and bound on first use, saved
  and restored by parameter names, continued exactly in another bucket layout.

Public API::

    values, indices = bench.comm.mstopk(x, k)
    state, hook = bench.comm.make_hook("hitopk", density=0.001, model=model)
    ddp_model.register_comm_hook(state, hook)
    torch.save(state.state_dict(), f"hook-rank{rank}.pt")   # and state.load_state_dict(...)

``hitopk`` on a single node is refused with a ConfigError (by :func:`validate` before
launch and by :func:`make_hook`, or when a state made before the process group binds):
with no slow link there is nothing for the hierarchy to save, and a record named
``hitopk`` that silently ran a flat scheme would mislead.  Use
``mstopk`` (flat allgather) on one node, or ``procs_per_node=1`` to make every worker its
own "node".

Training integration (used by :mod:`bench.train`)::

    validate(cfg.comm, world_size, nnodes)          # in the launcher, before workers start
    controller = attach(ddp_model, cfg.comm, steps_per_epoch=n)   # after DDP wrapping
    controller.set_epoch(epoch)     # before each epoch: dense warm-up, density schedule
    stats = controller.pop_stats()  # after each epoch: per-step means since the last pop
    is_sparse(cfg.comm.name)        # True: the record's density is cfg.comm.density, else 1.0
"""

from __future__ import annotations

from typing import Any

import torch

from bench.comm.communicators import COMMUNICATORS, CommStats
from bench.comm.compressors import COMPRESSORS, MEMORIES
from bench.comm.config import CommConfig
from bench.comm.hooks import HOOKS, HookOptions, HookSpec, is_sparse, make_hook
from bench.comm.selection import SELECTORS, mstopk, randomk, topk
from bench.comm.state import CommHookState, comm_hook
from bench.comm.topology import check_topology
from bench.registry import ConfigError

__all__ = [
    "COMMUNICATORS",
    "COMPRESSORS",
    "HOOKS",
    "MEMORIES",
    "SELECTORS",
    "CommController",
    "CommHookState",
    "CommStats",
    "HookSpec",
    "attach",
    "comm_hook",
    "is_sparse",
    "make_hook",
    "mstopk",
    "randomk",
    "topk",
    "validate",
]


def _hook_options(cfg: CommConfig, warmup_steps: int = 0) -> dict[str, Any]:
    """``make_hook``'s keyword arguments from the ``comm`` config."""
    return dict(
        density=float(cfg.density),
        error_feedback=bool(cfg.error_feedback),
        warmup_steps=warmup_steps,
        min_numel=int(cfg.min_numel),
        value_dtype=cfg.value_dtype,
        selector=cfg.selector,
        mstopk_method=cfg.mstopk_method,
        procs_per_node=int(cfg.procs_per_node),
        powersgd_rank=int(cfg.powersgd_rank),
        timing=bool(cfg.timing),
    )


def validate(cfg: CommConfig, world_size: int, nnodes: int) -> None:
    """Refuse a bad ``comm`` config before any worker starts (raises ConfigError)."""
    spec = HOOKS.get(cfg.name)
    opts = HookOptions(**_hook_options(cfg))
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


def attach(ddp_model: torch.nn.Module, cfg: CommConfig, steps_per_epoch: int) -> CommController:
    """Register the hook of ``cfg.name`` on a DDP model; call on every rank after DDP wrapping."""
    import torch.distributed as dist

    if not dist.is_initialized() or not hasattr(ddp_model, "register_comm_hook"):
        return CommController(_LocalState(), cfg, steps_per_epoch)  # one process: no exchange
    # a hook with its own warm-up counter (PowerSGD's start_powerSGD_iter) counts steps
    own = HOOKS.get(cfg.name).own_warmup
    warmup_steps = int(cfg.warmup_epochs) * int(steps_per_epoch) if own else 0
    state, hook = make_hook(cfg.name, **_hook_options(cfg, warmup_steps), model=ddp_model)
    ddp_model.register_comm_hook(state, hook)
    return CommController(state, cfg, steps_per_epoch)
