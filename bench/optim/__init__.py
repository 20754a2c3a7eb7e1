"""Optimizers, update modes and learning-rate schedules.

Training integration (used by :mod:`bench.train`)::

    optimizer = build_optimizer(model, cfg.optim)     # BEFORE wrapping the model in DDP
    scheduler = build_scheduler(optimizer, cfg.optim, steps_per_epoch, epochs)  # step() per step
"""

from __future__ import annotations

import math
from typing import Any

import torch

from bench.registry import ConfigError, Registry

OPTIMIZERS: Registry = Registry("optimizer")
UPDATE_MODES = ("naive", "foreach", "fused", "flat")


def param_groups(model: torch.nn.Module, weight_decay: float, no_decay_bn_bias: bool) -> list[dict]:
    """Two groups: decayed weights, and (when excluded) BN parameters and biases with wd 0."""
    if not no_decay_bn_bias:
        return [{"params": [p for p in model.parameters() if p.requires_grad], "weight_decay": weight_decay}]
    decay, no_decay = [], []
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            is_norm = isinstance(module, (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm, torch.nn.LayerNorm))
            (no_decay if is_norm or name == "bias" or p.ndim <= 1 else decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


@OPTIMIZERS.register("sgd")
def _sgd(groups: list[dict], cfg: Any) -> torch.optim.Optimizer:
    kw: dict[str, Any] = dict(lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov)
    if cfg.update == "naive":
        kw["foreach"] = False
    elif cfg.update == "foreach":
        kw["foreach"] = True
    elif cfg.update == "fused":
        kw["fused"] = True
    else:
        raise ConfigError(f"optim.update={cfg.update!r} is not available for sgd; choose naive, foreach or fused")
    return torch.optim.SGD(groups, **kw)


def validate(cfg: Any) -> None:
    """Configuration-time checks (before any worker starts)."""
    OPTIMIZERS.get(cfg.name)
    if cfg.update not in UPDATE_MODES:
        raise ConfigError(f"optim.update={cfg.update!r}; choose one of: {', '.join(UPDATE_MODES)}")
    if not cfg.lr > 0:
        raise ConfigError(f"optim.lr must be positive, got {cfg.lr}")
    if cfg.momentum < 0 or cfg.weight_decay < 0:
        raise ConfigError("optim.momentum and optim.weight_decay must be >= 0")
    if cfg.nesterov and cfg.momentum <= 0:
        raise ConfigError("optim.nesterov=true needs optim.momentum > 0")
    if cfg.schedule not in ("cosine", "step", "constant"):
        raise ConfigError(f"optim.schedule={cfg.schedule!r}; choose cosine, step or constant")
    if cfg.warmup_epochs < 0:
        raise ConfigError("optim.warmup_epochs must be >= 0")


def build_optimizer(model: torch.nn.Module, cfg: Any) -> torch.optim.Optimizer:
    validate(cfg)
    groups = param_groups(model, cfg.weight_decay, cfg.no_decay_bn_bias)
    return OPTIMIZERS.get(cfg.name)(groups, cfg)


def lr_factor(step: int, cfg: Any, steps_per_epoch: int, epochs: int) -> float:
    """Multiplier of the peak lr at a (0-based) optimizer step: linear warm-up then decay."""
    total = max(1, steps_per_epoch * epochs)
    warm = int(round(cfg.warmup_epochs * steps_per_epoch))
    if step < warm:
        s = cfg.warmup_start_factor
        return s + (1.0 - s) * step / warm
    if cfg.schedule == "constant":
        return 1.0
    if cfg.schedule == "step":
        frac = step / total
        return cfg.gamma ** sum(frac >= m for m in cfg.milestones)
    # cosine from the end of the warm-up to the end of the run
    t = min(1.0, (step - warm) / max(1, total - warm))
    f = cfg.final_lr_factor
    return f + (1.0 - f) * 0.5 * (1.0 + math.cos(math.pi * t))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Any, steps_per_epoch: int, epochs: int):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg, steps_per_epoch, epochs)
    )
