"""Optimizers, update modes and learning-rate schedules.

    optimizer = build_optimizer(model, cfg.optim)     # after model.to(device), BEFORE DDP
    ddp = DDP(model, **ddp_kwargs(optimizer))          # flat mode owns the gradient buffer
    after_ddp_broadcast(optimizer)                     # every rank: rank 0's master weights
    scheduler = build_scheduler(optimizer, cfg.optim, steps_per_epoch, epochs)

``cfg.update`` chooses how the same arithmetic runs: ``naive``, ``foreach``, ``fused``
(torch's) or ``flat`` (this package's flat buffers; docs/internals/optim.md).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bench.optim import adam, demo, lars, sgd  # noqa: F401  (each registers its specs)
from bench.optim.config import MasterWeights, OptimConfig, Schedule, UpdateMode
from bench.optim.flat import after_ddp_broadcast  # noqa: F401 - the public surface
from bench.optim.spec import OPTIMIZERS
from bench.registry import ConfigError

NORM_TYPES = (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm, torch.nn.LayerNorm)


def param_groups(model: torch.nn.Module, weight_decay: float, no_decay_bn_bias: bool) -> list[dict]:
    """Decayed weights, and (when excluded) norm parameters and biases with wd 0."""
    if not no_decay_bn_bias:
        params = [p for p in model.parameters() if p.requires_grad]
        return [{"params": params, "weight_decay": weight_decay}]
    decay, no_decay = [], []
    seen: set[int] = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:  # tied weights appear once
                continue
            seen.add(id(p))
            is_norm = isinstance(module, NORM_TYPES)
            (no_decay if is_norm or name == "bias" or p.ndim <= 1 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def validate(cfg: OptimConfig) -> None:
    """Configuration-time checks across fields (the types refuse unknown choices)."""
    spec = OPTIMIZERS.get(cfg.name)
    update = UpdateMode(cfg.update)
    if update not in spec.modes:
        raise ConfigError(
            f"optim.update={update} is not available for optim={cfg.name}; "
            f"choose one of: {', '.join(spec.mode_names())}"
        )
    if not cfg.lr > 0:
        raise ConfigError(f"optim.lr must be positive, got {cfg.lr}")
    if cfg.momentum < 0 or cfg.weight_decay < 0:
        raise ConfigError("optim.momentum and optim.weight_decay must be >= 0")
    if cfg.clip_norm < 0:
        raise ConfigError(f"optim.clip_norm must be >= 0 (0 = no clipping), got {cfg.clip_norm}")
    if not cfg.eps > 0:
        raise ConfigError(f"optim.eps must be positive, got {cfg.eps}")
    master = MasterWeights(cfg.master_weights)
    if master is not MasterWeights.off and update is not UpdateMode.flat:
        raise ConfigError(
            f"optim.master_weights={master} needs optim.update=flat "
            f"(or master_weights=off with optim.update={update})"
        )
    if cfg.warmup_epochs < 0:
        raise ConfigError("optim.warmup_epochs must be >= 0")
    spec.validate(cfg)


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """The configured optimizer over ``model``'s parameters (before DDP wraps it: ``flat``
    moves every parameter into its buffer, with ``master_weights`` as bf16/fp16)."""
    validate(cfg)
    groups = param_groups(model, cfg.weight_decay, cfg.no_decay_bn_bias)
    return OPTIMIZERS.get(cfg.name).build(groups, cfg)


def ddp_kwargs(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    del optimizer  # the same for every optimizer
    return {"gradient_as_bucket_view": True}


def lr_factor(step: int, cfg: OptimConfig, steps_per_epoch: int, epochs: int) -> float:
    """Multiplier of the peak lr at a (0-based) optimizer step: linear warm-up then decay."""
    total = max(1, steps_per_epoch * epochs)
    warm = int(round(cfg.warmup_epochs * steps_per_epoch))
    if step < warm:
        s = cfg.warmup_start_factor
        return s + (1.0 - s) * step / warm
    schedule = Schedule(cfg.schedule)
    if schedule is Schedule.constant:
        return 1.0
    if schedule is Schedule.inverse_sqrt:
        return math.sqrt(max(1, warm) / max(1, step))
    if schedule is Schedule.step:
        frac = step / total
        return cfg.gamma ** sum(frac >= m for m in cfg.milestones)
    # cosine from the end of the warm-up to the end of the run
    t = min(1.0, (step - warm) / max(1, total - warm))
    f = cfg.final_lr_factor
    return f + (1.0 - f) * 0.5 * (1.0 + math.cos(math.pi * t))


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, steps_per_epoch: int, epochs: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Per-step schedule: call ``scheduler.step()`` after every optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg, steps_per_epoch, epochs)
    )
